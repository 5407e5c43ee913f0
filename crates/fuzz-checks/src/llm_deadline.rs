//! `LlmDeadline::estimate` on arbitrary request bodies (any bytes, truncated or deeply nested
//! JSON): no panic, no stack overflow, and an estimate within `[min(base, max), max]`, for the
//! default settings and for arbitrary ones.

use std::time::Duration;

use stormguard_deadline::LlmDeadline;

/// The estimate's bounds for one body under one setting.
fn check_estimate(llm: &LlmDeadline, body: &[u8]) {
    let estimate = llm.estimate(body);
    assert!(estimate <= llm.max, "{estimate:?} above {:?}", llm.max);
    assert!(
        estimate >= llm.base.min(llm.max),
        "{estimate:?} below {:?}",
        llm.base
    );
}

/// The target's check of one input: panics when a property above does not hold.
pub fn check(data: &[u8]) {
    check_estimate(&LlmDeadline::default(), data);
    let (seed, body) = crate::input::u64_and_rest(data);
    let (max, _) = crate::input::u64_and_rest(body);
    let llm = LlmDeadline {
        base: Duration::from_millis(seed & 0xFFFF_FFFF),
        per_prompt_token: Duration::from_nanos((seed >> 32) & 0xFFFF),
        per_output_token: Duration::from_micros(seed >> 48),
        max: Duration::new(max, 0),
    };
    check_estimate(&llm, body);
}
