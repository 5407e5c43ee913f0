//! A hand-written SVG chart of one scenario: offered load, attempts reaching the provider (with
//! those answered 429, dashed, where there are any), attempts in flight and successes (with
//! fallback answers, dashed) per second, one line per pipeline, with the fault window (or the
//! bursts) shaded and the provider's throughput drawn in the attempts panel. A scenario with two
//! providers gets a panel for the attempts reaching the secondary, with its throughput, under
//! the primary's; one whose streams fail, a last panel for the content tokens shown twice to
//! callers; one whose streams start with a slow tail, a last panel for the hedges.

use std::fmt::Write as _;
use std::time::Duration;

use crate::metrics::Series;
use crate::scenario::Scenario;

const WIDTH: f64 = 960.0;
const PANEL_HEIGHT: f64 = 200.0;
const PANEL_GAP: f64 = 56.0;
const LEFT: f64 = 78.0;
const RIGHT: f64 = 180.0;
const TOP: f64 = 48.0;

/// Line colour of a pipeline (by name), grey for unknown names.
fn colour(name: &str) -> &'static str {
    match name {
        "none" => "#7f7f7f",
        "naive" => "#d62728",
        "tower" => "#ff7f0e",
        "stormguard" => "#2ca02c",
        "stormguard+continuation" => "#bcbd22",
        "stormguard+breaker" => "#1f77b4",
        "stormguard+rate-limit" => "#9467bd",
        "stormguard+adaptive" => "#8c564b",
        "naive+failover" => "#e377c2",
        "stormguard+failover" => "#17becf",
        "stormguard+hedge" => "#393b79",
        "naive-hedge" => "#d62728",
        "tower-hedge" => "#ff7f0e",
        "round-robin" => "#d62728",
        "ordered-failover" => "#ff7f0e",
        "stormguard+balance" => "#2ca02c",
        "stormguard+balance+cooldowns" => "#17becf",
        _ => "#7f7f7f",
    }
}

/// The smallest "nice" number (1, 2 or 5 x 10^k) at least `value`.
fn nice_ceiling(value: f64) -> f64 {
    if !value.is_finite() || value <= 0.0 {
        return 1.0;
    }
    let magnitude = 10f64.powf(value.log10().floor());
    [1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0]
        .into_iter()
        .map(|m| m * magnitude)
        .find(|v| *v >= value)
        .unwrap_or(10.0 * magnitude)
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Width of the plotting area of every panel, between the axis labels and the legend.
const PLOT_WIDTH: f64 = WIDTH - LEFT - RIGHT;

/// The longest pipeline name that fits in the legend at the chart's 12 px, in characters (about
/// 7 px each, in the right margin less the line before the name): `stormguard+failover`.
const LEGEND_CHARS: usize = 20;

/// Style of a pipeline's dashed line, which draws its second series.
const DASHED: &str = r#" stroke-dasharray="6,3""#;

struct Panel<'a> {
    title: &'a str,
    /// The title when the dashed series has something to show.
    dashed_title: &'a str,
    pick: fn(&Series) -> &[u64],
    /// A second series drawn dashed in the pipeline's colour, if any.
    dashed: Option<fn(&Series) -> &[u64]>,
    /// A provider's throughput per second, drawn dashed in grey, and its name in the legend.
    throughput: Option<(&'a [f64], &'a str)>,
}

impl<'a> Panel<'a> {
    /// A panel of one solid line per pipeline: no dashed series, no throughput.
    fn solid(title: &'a str, pick: fn(&Series) -> &[u64]) -> Panel<'a> {
        Panel {
            title,
            dashed_title: "",
            pick,
            dashed: None,
            throughput: None,
        }
    }

    /// The highest value the panel draws for `runs`, throughput included.
    fn peak(&self, runs: &[(&str, &Series)]) -> f64 {
        let peak = runs
            .iter()
            .flat_map(|(_, s)| {
                let dashed = self.dashed.map_or(&[][..], |pick| pick(s));
                (self.pick)(s).iter().chain(dashed).copied()
            })
            .max()
            .unwrap_or(0) as f64;
        match self.throughput {
            Some((capacity, _)) => capacity.iter().copied().fold(peak, f64::max),
            None => peak,
        }
    }

    /// The title: the dashed one when some run has a dashed series to show.
    fn title_for(&self, runs: &[(&str, &Series)]) -> &'a str {
        let dashes = self.dashed.is_some_and(|pick| {
            runs.iter()
                .any(|(_, series)| pick(series).iter().any(|v| *v > 0))
        });
        if dashes {
            self.dashed_title
        } else {
            self.title
        }
    }
}

/// What a panel draws: one series of a run.
type Pick = fn(&Series) -> &[u64];

/// What the panel of each of a balance scenario's deployments draws (the first three): the
/// attempts reaching it, and those it answered 429, dashed.
const DEPLOYMENT_PICKS: [(Pick, Pick); 3] = [
    (
        |s| deployment_series(s, 0).attempts,
        |s| deployment_series(s, 0).rate_limited,
    ),
    (
        |s| deployment_series(s, 1).attempts,
        |s| deployment_series(s, 1).rate_limited,
    ),
    (
        |s| deployment_series(s, 2).attempts,
        |s| deployment_series(s, 2).rate_limited,
    ),
];

/// Deployment `index`'s series in `series`: its attempts and its 429s per second (empty for a
/// run without it).
fn deployment_series(series: &Series, index: usize) -> DeploymentPanel<'_> {
    series
        .deployments
        .get(index)
        .map_or(DeploymentPanel::default(), |d| DeploymentPanel {
            attempts: &d.attempts,
            rate_limited: &d.rate_limited,
        })
}

/// The series of one deployment's panel.
#[derive(Default)]
struct DeploymentPanel<'a> {
    attempts: &'a [u64],
    rate_limited: &'a [u64],
}

/// The panels of a balance scenario's chart in place of the provider's attempts: one per
/// deployment (the first three), its attempts with those answered 429 dashed, and its
/// throughput (its quota), `deployments` holding each one's name, titles and throughput per
/// second.
fn deployment_panels(deployments: &[(String, [String; 2], Vec<f64>)]) -> Vec<Panel<'_>> {
    deployments
        .iter()
        .zip(DEPLOYMENT_PICKS)
        .map(
            |((name, [title, dashed_title], throughput), (pick, dashed))| Panel {
                title,
                dashed_title,
                pick,
                dashed: Some(dashed),
                throughput: Some((throughput, name)),
            },
        )
        .collect()
}

/// Each deployment of `scenario` as its panel names it: its name, its titles (plain, and with
/// the 429s), and its throughput per second over `seconds` (its quota, or nothing once dead).
fn deployment_lines(scenario: &Scenario, seconds: usize) -> Vec<(String, [String; 2], Vec<f64>)> {
    (0..scenario.deployments.len())
        .filter_map(|index| {
            let own = scenario.deployment(index)?;
            let name = scenario.deployments[index].name.to_owned();
            let title = format!("attempts reaching {name} (requests/s)");
            let dashed = format!("{title}; dashed: those answered 429");
            Some((name, [title, dashed], throughput(&own, seconds)))
        })
        .collect()
}

/// `provider`'s throughput at the middle of each of `seconds` seconds.
fn throughput(provider: &Scenario, seconds: usize) -> Vec<f64> {
    (0..seconds)
        .map(|s| provider.throughput_at(Duration::from_millis(s as u64 * 1_000 + 500)))
        .collect()
}

/// The panels of `scenario`'s chart, top to bottom. `primary` is the provider's throughput per
/// second, `secondary` the second provider's, where there is one; a scenario with `deployments`
/// (see [`deployment_lines`]) has a panel for each in place of the provider's.
fn panels<'a>(
    scenario: &Scenario,
    primary: &'a [f64],
    secondary: Option<&'a [f64]>,
    deployments: &'a [(String, [String; 2], Vec<f64>)],
) -> Vec<Panel<'a>> {
    let mut panels = vec![
        Panel::solid("offered load (requests/s)", |s| &s.offered),
        Panel {
            title: "attempts reaching the provider (requests/s)",
            dashed_title: "attempts reaching the provider (requests/s); dashed: those answered 429",
            pick: |s| &s.attempts,
            dashed: Some(|s| &s.rate_limited),
            throughput: Some((primary, "provider")),
        },
        Panel::solid(
            "attempts in flight, client side (most at once in each second)",
            |s| &s.in_flight,
        ),
        Panel {
            title: "successful answers (requests/s); dashed: the fallback's answers",
            dashed_title: "successful answers (requests/s); dashed: the fallback's answers",
            pick: |s| &s.successes,
            dashed: Some(|s| &s.fallbacks),
            throughput: None,
        },
    ];
    if let Some(secondary) = secondary {
        panels[1] = Panel {
            title: "attempts reaching the primary (requests/s)",
            dashed_title: "attempts reaching the primary (requests/s); dashed: those answered 429",
            throughput: Some((primary, "primary")),
            ..panels[1]
        };
        panels[2].title =
            "attempts in flight to the primary, client side (most at once in each second)";
        let attempts = Panel::solid("attempts reaching the secondary (requests/s)", |s| {
            &s.secondary_attempts
        });
        panels.insert(
            2,
            Panel {
                throughput: Some((secondary, "secondary")),
                ..attempts
            },
        );
    }
    if !deployments.is_empty() {
        panels.splice(1..2, deployment_panels(deployments));
        let in_flight = panels.len() - 2;
        panels[in_flight].title =
            "attempts in flight to the deployments, client side (most at once in each second)";
    }
    if scenario.streams_fail() {
        panels.push(Panel::solid(
            "content tokens shown twice to callers (tokens/s, by completion of the request)",
            |s| &s.duplicated_tokens,
        ));
    }
    if scenario.has_slow_starts() {
        panels.push(Panel::solid(
            "hedges reaching the provider (attempts/s sent while another of the request was open)",
            |s| &s.hedges,
        ));
    }
    panels
}

/// Where a panel is drawn: its top, the seconds its x axis spans, and the value at the top of
/// its y axis.
#[derive(Clone, Copy)]
struct Frame {
    top: f64,
    seconds: usize,
    y_max: f64,
}

impl Frame {
    fn bottom(&self) -> f64 {
        self.top + PANEL_HEIGHT
    }

    fn x(&self, second: f64) -> f64 {
        LEFT + second / self.seconds as f64 * PLOT_WIDTH
    }

    fn y(&self, value: f64) -> f64 {
        self.bottom() - value / self.y_max * PANEL_HEIGHT
    }

    /// Where the legend's entry number `row` goes, beside the plot.
    fn legend_at(&self, row: usize) -> (f64, f64) {
        (LEFT + PLOT_WIDTH + 8.0, self.top + 14.0 + row as f64 * 18.0)
    }
}

/// Render the chart of `scenario` for the runs `(pipeline name, series)`.
pub fn render(scenario: &Scenario, runs: &[(&str, &Series)]) -> String {
    let seconds = seconds_shown(scenario, runs);
    let capacity = throughput(scenario, seconds);
    let secondary = scenario.secondary();
    let secondary_capacity = secondary.as_ref().map(|s| throughput(s, seconds));
    let deployments = deployment_lines(scenario, seconds);
    let panels = panels(
        scenario,
        &capacity,
        secondary_capacity.as_deref(),
        &deployments,
    );
    let height = TOP + panels.len() as f64 * (PANEL_HEIGHT + PANEL_GAP) + 10.0;

    let mut svg = String::new();
    draw_heading(&mut svg, scenario, secondary.as_ref(), height);
    for (index, panel) in panels.iter().enumerate() {
        let frame = Frame {
            top: TOP + index as f64 * (PANEL_HEIGHT + PANEL_GAP),
            seconds,
            y_max: nice_ceiling(panel.peak(runs)),
        };
        draw_panel(&mut svg, scenario, panel, frame, runs);
    }
    svg.push_str("</svg>\n");
    svg
}

/// Seconds the x axis spans: the longest series, and at least the scenario's duration.
fn seconds_shown(scenario: &Scenario, runs: &[(&str, &Series)]) -> usize {
    runs.iter()
        .flat_map(|(_, s)| [s.offered.len(), s.attempts.len(), s.successes.len()])
        .max()
        .unwrap_or(0)
        .max(scenario.duration.as_secs() as usize)
        .max(1)
}

/// The SVG's opening, its white background, and the title naming the scenario, its load, the
/// providers' slots and the seed.
fn draw_heading(svg: &mut String, scenario: &Scenario, secondary: Option<&Scenario>, height: f64) {
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let slots = match secondary {
        Some(secondary) => format!("{} + {} slots", scenario.capacity, secondary.capacity),
        None => format!("{} slots", scenario.capacity),
    };
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="22" font-size="15" font-weight="bold">stormguard storm: scenario {} ({:.0} req/s, {slots}, seed {})</text>"#,
        scenario.name, scenario.qps, scenario.seed
    );
}

/// One panel: the shaded stretches, its title, axes and frame, the provider's throughput, one
/// line per run (and a dashed one where the run has something to show) and the legend.
fn draw_panel(
    svg: &mut String,
    scenario: &Scenario,
    panel: &Panel<'_>,
    frame: Frame,
    runs: &[(&str, &Series)],
) {
    let top = frame.top;
    for (from, to) in scenario.highlights(Duration::from_secs(frame.seconds as u64)) {
        let (from, to) = (frame.x(from.as_secs_f64()), frame.x(to.as_secs_f64()));
        let _ = writeln!(
            svg,
            r##"<rect x="{from:.1}" y="{top}" width="{:.1}" height="{PANEL_HEIGHT}" fill="#fbe3e3"/>"##,
            to - from
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{LEFT}" y="{:.1}" font-weight="bold">{}</text>"#,
        top - 8.0,
        escape(panel.title_for(runs))
    );
    draw_axes(svg, frame);
    if let Some((capacity, provider)) = panel.throughput {
        draw_throughput(svg, frame, capacity, provider, runs.len());
    }
    for (name, series) in runs {
        draw_line(svg, frame, (panel.pick)(series), name, "");
        // Only pipelines that have something to show get the dashed line.
        if let Some(values) = panel.dashed.map(|pick| pick(series))
            && values.iter().any(|v| *v > 0)
        {
            draw_line(svg, frame, values, name, DASHED);
        }
    }
    for (row, (name, _)) in runs.iter().enumerate() {
        let (lx, ly) = frame.legend_at(row);
        // A name longer than the legend's room is written smaller to fit, not cut at the edge.
        let fit = if name.len() > LEGEND_CHARS {
            let size = 12.0 * LEGEND_CHARS as f64 / name.len() as f64;
            format!(r#" font-size="{size:.1}""#)
        } else {
            String::new()
        };
        let _ = writeln!(
            svg,
            r#"<line x1="{lx:.1}" x2="{:.1}" y1="{ly:.1}" y2="{ly:.1}" stroke="{}" stroke-width="3"/><text x="{:.1}" y="{:.1}"{fit}>{}</text>"#,
            lx + 18.0,
            colour(name),
            lx + 24.0,
            ly + 4.0,
            escape(name)
        );
    }
}

/// A panel's grid lines with their values, its seconds under it, and its frame.
fn draw_axes(svg: &mut String, frame: Frame) {
    for tick in 0..=4 {
        let value = frame.y_max * f64::from(tick) / 4.0;
        let _ = writeln!(
            svg,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{:.1}" y2="{:.1}" stroke="#e0e0e0"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + PLOT_WIDTH,
            frame.y(value),
            frame.y(value),
            LEFT - 6.0,
            frame.y(value) + 4.0,
            format_count(value)
        );
    }
    let step = if frame.seconds > 30 { 10 } else { 5 };
    for second in (0..=frame.seconds).step_by(step) {
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{second} s</text>"#,
            frame.x(second as f64),
            frame.bottom() + 16.0
        );
    }
    let top = frame.top;
    let _ = writeln!(
        svg,
        r##"<rect x="{LEFT}" y="{top}" width="{PLOT_WIDTH}" height="{PANEL_HEIGHT}" fill="none" stroke="#999"/>"##
    );
}

/// A provider's throughput per second, dashed in grey, and its entry in the legend, under the
/// `runs` pipelines' entries.
fn draw_throughput(svg: &mut String, frame: Frame, capacity: &[f64], provider: &str, runs: usize) {
    let points: Vec<String> = capacity
        .iter()
        .enumerate()
        .flat_map(|(s, c)| [(s as f64, *c), (s as f64 + 1.0, *c)])
        .map(|(s, c)| format!("{:.1},{:.1}", frame.x(s), frame.y(c)))
        .collect();
    let _ = writeln!(
        svg,
        r##"<polyline points="{}" fill="none" stroke="#444" stroke-dasharray="5,4" stroke-width="1.2"/>"##,
        points.join(" ")
    );
    let (lx, ly) = frame.legend_at(runs);
    let _ = writeln!(
        svg,
        r##"<line x1="{lx:.1}" x2="{:.1}" y1="{ly:.1}" y2="{ly:.1}" stroke="#444" stroke-dasharray="5,4"/><text x="{:.1}" y="{:.1}" fill="#444">{provider}</text><text x="{:.1}" y="{:.1}" fill="#444">throughput</text>"##,
        lx + 18.0,
        lx + 24.0,
        ly + 4.0,
        lx + 24.0,
        ly + 18.0
    );
}

/// One series of pipeline `name`, a point in the middle of each second, in its colour; `dash`
/// is the line's extra style.
fn draw_line(svg: &mut String, frame: Frame, values: &[u64], name: &str, dash: &str) {
    let points: Vec<String> = values
        .iter()
        .enumerate()
        .map(|(s, v)| format!("{:.1},{:.1}", frame.x(s as f64 + 0.5), frame.y(*v as f64)))
        .collect();
    let _ = writeln!(
        svg,
        r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="1.8"{dash}/>"#,
        points.join(" "),
        colour(name)
    );
}

fn format_count(value: f64) -> String {
    if value >= 1_000.0 {
        format!("{}k", value / 1_000.0)
    } else {
        format!("{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenarios;

    #[test]
    fn nice_ceilings() {
        assert_eq!(nice_ceiling(0.0), 1.0);
        assert_eq!(nice_ceiling(12_000.0), 12_000.0);
        assert_eq!(nice_ceiling(12_100.0), 15_000.0);
        assert_eq!(nice_ceiling(48_100.0), 50_000.0);
        assert_eq!(nice_ceiling(5.0), 5.0);
        assert_eq!(nice_ceiling(f64::NAN), 1.0);
    }

    #[test]
    fn chart_has_one_line_per_pipeline_and_panel() {
        let scenario = scenarios::SEED
            .scenario()
            .with_duration(Duration::from_secs(6));
        let series = Series {
            offered: vec![10; 6],
            attempts: vec![12; 6],
            in_flight: vec![15; 6],
            successes: vec![9; 6],
            fallbacks: vec![0; 6],
            ..Series::default()
        };
        let svg = render(&scenario, &[("naive", &series), ("stormguard", &series)]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert_eq!(
            svg.matches(r##"stroke="#d62728" stroke-width="1.8""##)
                .count(),
            4
        );
        assert_eq!(
            svg.matches(r##"stroke="#2ca02c" stroke-width="1.8""##)
                .count(),
            4
        );
        assert_eq!(
            svg.matches("stroke-dasharray").count(),
            2,
            "provider throughput line and its legend; no fallback line without fallbacks"
        );
    }

    #[test]
    fn two_providers_get_a_panel_for_the_secondary_with_its_throughput() {
        let scenario = scenarios::FAILOVER.scenario();
        let series = Series {
            offered: vec![10; 60],
            attempts: vec![10; 60],
            secondary_attempts: vec![4; 60],
            in_flight: vec![10; 60],
            successes: vec![10; 60],
            fallbacks: vec![0; 60],
            ..Series::default()
        };
        let svg = render(&scenario, &[("stormguard+failover", &series)]);
        assert_eq!(
            svg.matches(r##"stroke="#17becf" stroke-width="1.8""##)
                .count(),
            5,
            "one line a panel, five panels"
        );
        assert!(svg.contains("attempts reaching the primary (requests/s)"));
        assert!(svg.contains("attempts reaching the secondary (requests/s)"));
        assert!(svg.contains(">secondary</text>") && svg.contains(">primary</text>"));
        assert!(svg.contains("1813 + 1088 slots"));
        let one = render(&scenarios::OUTAGE.scenario(), &[("stormguard", &series)]);
        assert!(!one.contains("secondary") && one.contains(">provider</text>"));
    }

    #[test]
    fn streams_get_a_panel_for_the_tokens_shown_twice() {
        let scenario = scenarios::STREAMS.scenario();
        let series = Series {
            offered: vec![10; 60],
            attempts: vec![10; 60],
            in_flight: vec![10; 60],
            successes: vec![10; 60],
            fallbacks: vec![0; 60],
            duplicated_tokens: vec![25; 60],
            ..Series::default()
        };
        let svg = render(&scenario, &[("naive", &series)]);
        assert_eq!(
            svg.matches(r##"stroke="#d62728" stroke-width="1.8""##)
                .count(),
            5,
            "one line a panel, five panels"
        );
        assert!(svg.contains("content tokens shown twice to callers"));
        let one = render(&scenarios::SEED.scenario(), &[("naive", &series)]);
        assert!(!one.contains("shown twice"));
    }

    #[test]
    fn fallback_answers_are_a_dashed_line_of_the_pipelines_colour() {
        let scenario = scenarios::BLACKHOLE.scenario();
        let series = Series {
            offered: vec![10; 60],
            attempts: vec![10; 60],
            in_flight: vec![10; 60],
            successes: vec![10; 60],
            fallbacks: vec![3; 60],
            ..Series::default()
        };
        let svg = render(&scenario, &[("stormguard+breaker", &series)]);
        assert_eq!(
            svg.matches(r##"stroke="#1f77b4" stroke-width="1.8" stroke-dasharray="6,3""##)
                .count(),
            1
        );
    }
}
