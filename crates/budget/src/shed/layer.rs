use tower_layer::Layer;

use super::ShedRetries;
use crate::RetryBudget;

/// Sheds retried requests beyond the server's retry budget without calling the handler. See the
/// [module docs](crate::shed) for what is shed and how.
///
/// Cheap to clone; every clone, and every service it builds, shares one [`RetryBudget`].
#[derive(Clone, Debug, Default)]
pub struct ShedRetriesLayer {
    budget: RetryBudget,
}

impl ShedRetriesLayer {
    /// A layer drawing on `budget` (which may also be shared with other layers or read for
    /// metrics through [`RetryBudget::snapshot`]).
    pub fn new(budget: RetryBudget) -> Self {
        Self { budget }
    }

    /// The budget this layer draws on.
    pub fn budget(&self) -> &RetryBudget {
        &self.budget
    }
}

impl<S> Layer<S> for ShedRetriesLayer {
    type Service = ShedRetries<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ShedRetries::new(inner, self.budget.clone())
    }
}
