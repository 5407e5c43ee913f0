//! The results file (one line a subject: its name, then `key=value` fields, tab-separated) and
//! the markdown table made of it. Latencies are in microseconds; the subjects' rows show them
//! minus the reference's (the mock alone) at the same rate: the latency each subject adds.

use std::collections::BTreeMap;
use std::fmt::Write;

/// One subject's figures.
#[derive(Debug, Default)]
pub struct Row {
    /// What was measured.
    pub name: String,
    /// Its figures by key.
    pub fields: BTreeMap<String, f64>,
}

impl Row {
    /// The line of the results file for this row.
    pub fn line(&self) -> String {
        let mut line = self.name.replace('\t', " ");
        for (key, value) in &self.fields {
            let _ = write!(line, "\t{key}={value}");
        }
        line
    }

    /// A row of the results file; fields that do not parse are left out.
    pub fn parse(line: &str) -> Option<Self> {
        let mut parts = line.split('\t');
        let name = parts.next().filter(|name| !name.is_empty())?.to_owned();
        let fields = parts
            .filter_map(|field| {
                let (key, value) = field.split_once('=')?;
                Some((key.to_owned(), value.parse().ok()?))
            })
            .collect();
        Some(Self { name, fields })
    }

    fn get(&self, key: &str) -> Option<f64> {
        self.fields.get(key).copied()
    }
}

/// The markdown table of `rows` (the reference first) at the offered `rates`.
pub fn markdown(rows: &[Row], rates: &[u64]) -> String {
    let reference = rows.iter().find(|row| row.get("reference") == Some(1.0));
    let floor = rows.iter().find(|row| row.get("floor") == Some(1.0));
    let mut out = String::from("| Subject | Saturation (req/s) | x floor |");
    for rate in rates {
        let _ = write!(out, " p50 / p99 at {rate}/s (ms) |");
    }
    out.push_str(" stream first token p50 / p99 (ms) | RSS idle / peak (MiB) | start (ms) | size (MiB) | failed |\n|---|");
    out.push_str(&"---:|".repeat(rates.len() + 7));
    out.push('\n');
    for row in rows {
        let is_reference = reference.is_some_and(|r| std::ptr::eq(r, row));
        let base = if is_reference { None } else { reference };
        let name = if is_reference {
            format!("{} (reference: absolute)", row.name)
        } else {
            row.name.clone()
        };
        let _ = write!(
            out,
            "| {name} | {} | {} |",
            number(row.get("sat"), 0),
            ratio(row, floor)
        );
        for rate in rates {
            let pair = pair(row, base, &format!("p50@{rate}"), &format!("p99@{rate}"));
            let _ = write!(out, " {pair} |");
        }
        let stream_rate = match (
            row.get("stream_rate"),
            reference.and_then(|r| r.get("stream_rate")),
        ) {
            (Some(own), Some(reference)) if own < reference => format!(" (at {own:.0}/s)"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            " {}{stream_rate} | {} / {} | {} | {} | {} |",
            pair(row, base, "ttft50", "ttft99"),
            number(row.get("rss_idle_kib").map(|k| k / 1024.0), 1),
            number(row.get("rss_peak_kib").map(|k| k / 1024.0), 1),
            number(row.get("start_ms"), 0),
            number(row.get("size_bytes").map(|b| b / 1_048_576.0), 1),
            number(row.get("failed"), 0),
        );
    }
    out
}

/// `p50 / p99` of `row` in ms, minus `base`'s when given; `-` where either is missing.
fn pair(row: &Row, base: Option<&Row>, p50: &str, p99: &str) -> String {
    let added = |key: &str| {
        let value = row.get(key)?;
        match base {
            Some(base) => Some(value - base.get(key)?),
            None => Some(value),
        }
    };
    format!(
        "{} / {}",
        number(added(p50).map(|us| us / 1000.0), 2),
        number(added(p99).map(|us| us / 1000.0), 2)
    )
}

fn ratio(row: &Row, floor: Option<&Row>) -> String {
    let floor = floor
        .and_then(|floor| floor.get("sat"))
        .filter(|sat| *sat > 0.0);
    match row.get("sat").zip(floor).map(|(sat, floor)| sat / floor) {
        // A subject a hundred times slower than the floor still shows a figure.
        Some(ratio) if ratio < 0.1 => number(Some(ratio), 4),
        ratio => number(ratio, 2),
    }
}

fn number(value: Option<f64>, decimals: usize) -> String {
    match value {
        Some(value) if value.is_finite() => format!("{value:.decimals$}"),
        _ => "-".to_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn row(name: &str, fields: &[(&str, f64)]) -> Row {
        let fields = fields.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect();
        Row {
            name: name.to_owned(),
            fields,
        }
    }

    #[test]
    fn a_line_reads_back_as_written() {
        let written = row("bare proxy", &[("sat", 57000.5), ("p50@200", 310.0)]);
        let read = Row::parse(&written.line()).unwrap();
        assert_eq!(read.name, "bare proxy");
        assert_eq!(read.get("sat"), Some(57000.5));
        assert_eq!(read.get("p50@200"), Some(310.0));
        assert!(Row::parse("").is_none());
        assert!(Row::parse("name\tbroken\tsat=x").unwrap().fields.is_empty());
    }

    #[test]
    fn subjects_show_what_they_add_to_the_reference() {
        let rows = [
            row(
                "mock",
                &[
                    ("reference", 1.0),
                    ("sat", 60000.0),
                    ("p50@200", 200.0),
                    ("p99@200", 400.0),
                ],
            ),
            row(
                "proxy",
                &[
                    ("floor", 1.0),
                    ("sat", 40000.0),
                    ("p50@200", 500.0),
                    ("p99@200", 1400.0),
                ],
            ),
            row("gateway", &[("sat", 30000.0), ("p50@200", 700.0)]),
            row(
                "slow",
                &[
                    ("sat", 40.0),
                    ("stream_rate", 20.0),
                    ("ttft50", 900.0),
                    ("ttft99", 2000.0),
                ],
            ),
        ];
        let table = markdown(&rows, &[200]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 6);
        assert!(
            lines[2].starts_with("| mock (reference: absolute) | 60000 | 1.50 | 0.20 / 0.40 |"),
            "{}",
            lines[2]
        );
        assert!(
            lines[3].starts_with("| proxy | 40000 | 1.00 | 0.30 / 1.00 |"),
            "{}",
            lines[3]
        );
        assert!(
            lines[4].starts_with("| gateway | 30000 | 0.75 | 0.50 / - |"),
            "{}",
            lines[4]
        );
    }
}
