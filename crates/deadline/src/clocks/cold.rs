//! The clocks of a cold backend: what a request may wait before anything is learned (a restart,
//! a scale-out, a new deployment), from what healthy providers do and from the request.

use std::time::Duration;

use super::shape::RequestShape;

/// The limits of a backend whose clocks have learned nothing yet, sized from the request. Where a
/// cut could lose a healthy slow answer they do not cut: a stream slow to its first content gets
/// a hedge beside it (budgeted; the original runs on and answers if it is first), and only a
/// stream the engine would continue (never restart) is cut for a gap.
///
/// | limit | what it does | default |
/// |---|---|---|
/// | first content of a stream, from sending | a hedge | 10 s + 0.25 ms per prompt token |
/// | the same, reasoning asked for | a hedge | 60 s + 0.25 ms per prompt token |
/// | gap between two content events | a cut, then a continuation | 10 s; none when reasoning is asked for or the stream would not be continued |
///
/// Why these:
///
/// - A healthy provider's first token comes within a second or two of a short prompt: chat
///   users expect 200 to 800 ms, and 2 s is where abandonment rises (CostHawk's TTFT glossary,
///   2026); a gateway's callers expect the same. Ten seconds is five times that worst healthy
///   figure, and beyond what a busy moment adds (a public failover crash-test's reference client
///   fails over a slow first token at about 11 s).
/// - The prompt adds its prefill: measured per input token, 0.04 to 0.24 ms at the 95th
///   percentile across shared APIs and dedicated servers (Nirmalya, "Prompt size impact on LLM
///   response", 2026; about 5 s for 100,000 tokens of a 70B model on an H100 in ByteBell's
///   figures). 0.25 ms a token is the slow end: 25 s more for 100,000 tokens.
/// - A reasoning model thinks before its first content for tens of seconds, minutes at worst;
///   60 s lets the common case answer without a second attempt, and the hedge that goes after
///   it cannot lose the first.
/// - Between two content events a healthy stream pauses for tens of milliseconds (a token) and,
///   under load, seconds: 10 s is a stall. Cutting it loses nothing when the engine continues
///   the stream from what was delivered (a continuation asks only for the rest); a stream of
///   reasoning (its thinking cannot be a prefill) or one nobody continues is left to its learned
///   clock or the stream guard's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ColdClocks {
    /// A stream's first content, from sending, with no reasoning asked for: 10 s.
    pub first_content: Duration,
    /// A stream's first content, from sending, with reasoning asked for: 60 s.
    pub reasoning_first_content: Duration,
    /// Added to the first content's limit per prompt token (prefill): 0.25 ms.
    pub per_prompt_token: Duration,
    /// The longest wait between two content events of a stream the engine continues: 10 s.
    pub gap: Duration,
}

impl Default for ColdClocks {
    fn default() -> Self {
        Self {
            first_content: Duration::from_secs(10),
            reasoning_first_content: Duration::from_secs(60),
            per_prompt_token: Duration::from_micros(250),
            gap: Duration::from_secs(10),
        }
    }
}

impl ColdClocks {
    /// How long an attempt of a request shaped `shape` waits for its first content before it is
    /// hedged: `None` for a whole answer (its head clock is sized by its
    /// request already, and a second long generation beside it would double its cost).
    pub fn first_content(&self, shape: RequestShape) -> Option<Duration> {
        if !shape.streaming {
            return None;
        }
        let base = match shape.reasoning {
            true => self.reasoning_first_content,
            false => self.first_content,
        };
        let tokens = u32::try_from(shape.prompt_tokens).unwrap_or(u32::MAX);
        let prefill = self.per_prompt_token.saturating_mul(tokens);
        Some(base.saturating_add(prefill))
    }

    /// The longest wait between two content events of a stream of a request shaped `shape`
    /// (`continued`: the engine continues it if it is cut): `None` for reasoning, or a stream
    /// that a cut would end.
    pub fn gap(&self, shape: RequestShape, continued: bool) -> Option<Duration> {
        (continued && !shape.reasoning).then_some(self.gap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    #[test]
    fn a_stream_is_hedged_after_ten_seconds_plus_its_prefill() {
        let cold = ColdClocks::default();
        let mut shape = RequestShape::new(true, SECOND * 20);
        assert_eq!(cold.first_content(shape), Some(SECOND * 10));
        shape.prompt_tokens = 100_000;
        assert_eq!(cold.first_content(shape), Some(SECOND * 35));
        shape.reasoning = true;
        assert_eq!(cold.first_content(shape), Some(SECOND * 85));
        // A whole answer is left to its head clock.
        assert_eq!(cold.first_content(RequestShape::new(false, SECOND)), None);
        // Hostile sizes saturate.
        shape.prompt_tokens = u64::MAX;
        assert!(cold.first_content(shape).is_some());
    }

    #[test]
    fn a_gap_is_cut_only_where_the_stream_is_continued_and_no_reasoning_was_asked() {
        let cold = ColdClocks::default();
        let mut shape = RequestShape::new(true, SECOND);
        assert_eq!(cold.gap(shape, true), Some(SECOND * 10));
        assert_eq!(cold.gap(shape, false), None);
        shape.reasoning = true;
        assert_eq!(cold.gap(shape, true), None);
    }
}
