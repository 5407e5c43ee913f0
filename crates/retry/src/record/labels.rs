//! The GenAI attributes of a request's figures ([`GenAiLabels`]), and the bound on the values
//! that come from requests and answers ([`Bounded`]): see [`metrics`](crate::metrics).

use std::sync::{Arc, PoisonError, RwLock};

use http::request::Parts;
use metrics::SharedString;
use stormguard_classify::usage::model_named;
use tokio::time::Instant;

use crate::metrics::{
    GenAiNames, MAX_LABEL_LEN, MAX_LABEL_VALUES, OPERATION_NAME, OTHER, PROVIDER, REQUEST_MODEL,
    SERVER_ADDRESS, SERVER_PORT, operation_name,
};

/// The models requests named, as labels.
static REQUEST_MODELS: Bounded = Bounded::new(MAX_LABEL_VALUES);
/// The models answers named, as labels.
pub(crate) static RESPONSE_MODELS: Bounded = Bounded::new(MAX_LABEL_VALUES);
/// The hosts attempts went to, as labels.
static SERVERS: Bounded = Bounded::new(MAX_LABEL_VALUES);
/// The ports attempts went to, other than the schemes' own, as labels.
static PORTS: Bounded = Bounded::new(MAX_LABEL_VALUES);

/// The `gen_ai.provider.name` of a layer with no name.
const UNKNOWN: &str = "unknown";

/// A label's values, bounded: the first `max` distinct values keep their names, later ones and
/// values unfit for a label are [`OTHER`].
pub(crate) struct Bounded {
    max: usize,
    values: RwLock<Vec<SharedString>>,
}

impl Bounded {
    pub(crate) const fn new(max: usize) -> Self {
        Self {
            max,
            values: RwLock::new(Vec::new()),
        }
    }

    /// `value` as a label.
    pub(crate) fn label(&self, value: &str) -> SharedString {
        if !fits(value) {
            return SharedString::const_str(OTHER);
        }
        let known =
            |values: &[SharedString]| values.iter().find(|known| known.as_ref() == value).cloned();
        let values = self.values.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(label) = known(&values) {
            return label;
        }
        drop(values);
        let mut values = self.values.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(label) = known(&values) {
            return label;
        }
        if values.len() >= self.max {
            return SharedString::const_str(OTHER);
        }
        let label = SharedString::from(Arc::<str>::from(value));
        values.push(label.clone());
        label
    }
}

/// Whether `value` may be a label: not empty, at most [`MAX_LABEL_LEN`] bytes of letters, digits
/// and `-._:/@+` (what model names and host names are made of).
fn fits(value: &str) -> bool {
    !value.is_empty()
        && value.len() <= MAX_LABEL_LEN
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._:/@+".contains(&b))
}

/// The model Gemini's path names: `/v1beta/models/{model}:generateContent`.
fn model_in_path(path: &str) -> Option<&str> {
    let (_, after) = path.split_once("/models/")?;
    let (model, _) = after.split_once(':')?;
    Some(model)
}

/// The attributes every GenAI figure of one request carries.
#[derive(Clone)]
pub(crate) struct GenAiLabels {
    pub(crate) provider: SharedString,
    pub(crate) operation: &'static str,
    pub(crate) request_model: Option<SharedString>,
    /// `server.address` and `server.port`.
    pub(crate) server: Option<(SharedString, SharedString)>,
    /// The generation of names recorded.
    pub(crate) names: GenAiNames,
    /// When the request started.
    pub(crate) started: Instant,
}

impl GenAiLabels {
    /// The labels of a request to the backend named `name`, with head `head`.
    pub(crate) fn new(name: Option<&Arc<str>>, head: &Parts) -> Self {
        let provider = match name {
            Some(name) => SharedString::from(Arc::clone(name)),
            None => SharedString::const_str(UNKNOWN),
        };
        let path = head.uri.path();
        let server = head.uri.host().map(|host| {
            let port = match head.uri.port_u16() {
                Some(port) => PORTS.label(&port.to_string()),
                None if head.uri.scheme_str() == Some("http") => SharedString::const_str("80"),
                None => SharedString::const_str("443"),
            };
            (SERVERS.label(host), port)
        });
        Self {
            provider,
            operation: operation_name(path),
            request_model: model_in_path(path).map(|model| REQUEST_MODELS.label(model)),
            server,
            names: GenAiNames::of_process(),
            started: Instant::now(),
        }
    }

    /// The request's body, read whole, names its model (unless its path did).
    pub(crate) fn request_read(&mut self, body: &[u8]) {
        if self.request_model.is_none() {
            self.request_model = model_named(body).map(|model| REQUEST_MODELS.label(model));
        }
    }

    /// Whether the latest generation's inference names apply.
    pub(crate) fn latest_inference(&self) -> bool {
        self.names == GenAiNames::Latest && crate::metrics::is_inference(self.operation)
    }

    /// The attributes, as labels, with `response_model` if known.
    pub(crate) fn labels(&self, response_model: Option<&str>) -> Vec<metrics::Label> {
        let mut labels = Vec::with_capacity(7);
        labels.push(metrics::Label::new(PROVIDER, self.provider.clone()));
        labels.push(metrics::Label::from_static_parts(
            OPERATION_NAME,
            self.operation,
        ));
        if let Some(model) = &self.request_model {
            labels.push(metrics::Label::new(REQUEST_MODEL, model.clone()));
        }
        if let Some(model) = response_model {
            let model = RESPONSE_MODELS.label(model);
            labels.push(metrics::Label::new(crate::metrics::RESPONSE_MODEL, model));
        }
        if let Some((address, port)) = &self.server {
            labels.push(metrics::Label::new(SERVER_ADDRESS, address.clone()));
            labels.push(metrics::Label::new(SERVER_PORT, port.clone()));
        }
        labels
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_bounded_label_keeps_its_first_values_and_refuses_unfit_ones() {
        let bounded = Bounded::new(3);
        for model in ["a", "b", "a", "c", "d", "b"] {
            let label = bounded.label(model);
            let expected = if model == "d" { OTHER } else { model };
            assert_eq!(&*label, expected);
        }
        // Once full, every new value is the same one.
        for n in 0..1000 {
            assert_eq!(&*bounded.label(&format!("model-{n}")), OTHER);
        }
        assert_eq!(bounded.values.read().unwrap().len(), 3);
        let fresh = Bounded::new(3);
        let long = "m".repeat(MAX_LABEL_LEN + 1);
        for unfit in ["", "gpt 4", "a\nb", "ünï", long.as_str(), "{}"] {
            assert_eq!(&*fresh.label(unfit), OTHER, "{unfit:?}");
        }
        assert!(fresh.values.read().unwrap().is_empty());
        let fitting = "m".repeat(MAX_LABEL_LEN);
        assert_eq!(&*fresh.label(&fitting), fitting);
        assert_eq!(
            &*fresh.label("accounts/x/models/llama-v3:0@1+2"),
            "accounts/x/models/llama-v3:0@1+2"
        );
    }

    #[test]
    fn gemini_s_path_names_its_model() {
        assert_eq!(
            model_in_path("/v1beta/models/gemini-2.0-flash:generateContent"),
            Some("gemini-2.0-flash")
        );
        assert_eq!(model_in_path("/v1/chat/completions"), None);
    }
}
