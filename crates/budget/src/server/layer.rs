use tower_layer::Layer;

use super::RetryBudgetService;
use crate::RetryBudget;

/// Server-side retry budget: sheds retried requests beyond the budget without calling the
/// handler. See the [module docs](crate::server) for what is shed and how.
///
/// Cheap to clone; every clone, and every service it builds, shares one [`RetryBudget`].
#[derive(Clone, Debug, Default)]
pub struct RetryBudgetLayer {
    budget: RetryBudget,
}

impl RetryBudgetLayer {
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

impl<S> Layer<S> for RetryBudgetLayer {
    type Service = RetryBudgetService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RetryBudgetService::new(inner, self.budget.clone())
    }
}
