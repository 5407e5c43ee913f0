//! The printed table.

use std::fmt::Write as _;

use crate::metrics::Summary;

/// One row per pipeline, aligned columns, with a header line.
pub fn table(summaries: &[Summary]) -> String {
    let header = [
        "pipeline",
        "offered",
        "attempts",
        "ampl",
        "peak ampl",
        "peak load",
        "success",
        "p50 ms",
        "p99 ms",
        "overloaded",
        "recovery",
        "fault load",
        "retries",
        "early retries",
    ];
    let rows: Vec<[String; 14]> = summaries
        .iter()
        .map(|s| {
            [
                s.name.to_owned(),
                s.offered.to_string(),
                s.backend_attempts.to_string(),
                format!("{:.2}x", s.amplification),
                format!("{:.2}x", s.peak_amplification),
                format!("{:.2}x", s.peak_load),
                format!("{:.2}%", s.success_rate * 100.0),
                s.p50_ms.to_string(),
                s.p99_ms.to_string(),
                format!("{} s", s.overloaded_s),
                s.recovery_s
                    .map_or_else(|| "never".to_owned(), |r| format!("{r:.0} s")),
                format!("{:.2}x", s.fault_load),
                s.retries.to_string(),
                s.early_retries.to_string(),
            ]
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([header[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let line = |out: &mut String, cells: &[&str]| {
        for (c, cell) in cells.iter().enumerate() {
            if c == 0 {
                let _ = write!(out, "{cell:<width$}", width = widths[c]);
            } else {
                let _ = write!(out, "  {cell:>width$}", width = widths[c]);
            }
        }
        out.push('\n');
    };
    line(&mut out, &header);
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        line(&mut out, &cells);
    }
    out
}

/// What the columns mean, printed under the table.
pub const LEGEND: &str = "\
ampl = attempts reaching the provider / offered (peak ampl: in the worst second);
peak load = most requests in the provider at once (running + queued) / its slots;
overloaded = seconds in which over 1% of attempts found every slot busy;
recovery = seconds after the fault ends until goodput stays >= 95% of offered (per second of arrival);
fault load = attempts / offered during the fault, after its first 3 s;
retries = attempts that repeat a request; early retries = those sent before the Retry-After they
were given.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns_and_says_never() {
        let summary = Summary {
            name: "naive",
            offered: 720_000,
            backend_attempts: 2_500_000,
            amplification: 3.47,
            peak_amplification: 3.9,
            peak_load: 1.9,
            success_rate: 0.41,
            p50_ms: 4_000,
            p99_ms: 16_000,
            overloaded_s: 50,
            recovery_s: None,
            fault_load: 3.9,
            retries: 1_780_000,
            early_retries: 0,
            successes: 295_200,
        };
        let text = table(&[summary]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].len(), lines[1].len());
        assert!(
            lines[1].contains("3.47x") && lines[1].contains("never") && lines[1].contains("41.00%")
        );
    }
}
