//! Line charts as standalone SVG, for BENCHMARKS.md: what a run measured
//! over time, drawn by the same run that wrote the table.

use std::fmt::Write as _;

/// One chart.
#[derive(Clone, Debug)]
pub struct Plot {
    /// The file name, e.g. `join.svg`.
    pub file: String,
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    /// A logarithmic x axis (latencies).
    pub log_x: bool,
    /// Each line: its label and its points in order of x.
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

const WIDTH: f64 = 720.0;
const HEIGHT: f64 = 380.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 62.0;
const BOTTOM: f64 = 50.0;
const COLOURS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b",
];

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A short label for an axis value.
fn tick_label(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

impl Plot {
    /// The chart as an SVG document.
    pub fn svg(&self) -> String {
        let points = self.series.iter().flat_map(|(_, p)| p.iter());
        let fx = |x: f64| if self.log_x { x.max(1e-9).log10() } else { x };
        let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
        for &(x, y) in points {
            x0 = x0.min(fx(x));
            x1 = x1.max(fx(x));
            y1 = y1.max(y);
        }
        if !x0.is_finite() {
            (x0, x1) = (0.0, 1.0);
        }
        if x1 <= x0 {
            x1 = x0 + 1.0;
        }
        if y1 <= 0.0 {
            y1 = 1.0;
        }
        y1 *= 1.05;
        let px = |x: f64| LEFT + (fx(x) - x0) / (x1 - x0) * (WIDTH - LEFT - RIGHT);
        let py = |y: f64| HEIGHT - BOTTOM - y / y1 * (HEIGHT - TOP - BOTTOM);
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(
            out,
            r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
            WIDTH / 2.0,
            escape(&self.title)
        );
        // Axes, grid and ticks.
        let _ = writeln!(
            out,
            r##"<g stroke="#888"><line x1="{LEFT}" y1="{b}" x2="{r}" y2="{b}"/><line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{b}"/></g>"##,
            b = HEIGHT - BOTTOM,
            r = WIDTH - RIGHT
        );
        for i in 0..=5 {
            let y = y1 / 1.05 * f64::from(i) / 5.0;
            let _ = writeln!(
                out,
                r##"<line x1="{LEFT}" y1="{p:.1}" x2="{r}" y2="{p:.1}" stroke="#eee"/><text x="{t}" y="{q:.1}" text-anchor="end">{}</text>"##,
                tick_label(y),
                p = py(y),
                q = py(y) + 4.0,
                r = WIDTH - RIGHT,
                t = LEFT - 6.0
            );
            let fraction = f64::from(i) / 5.0;
            let x = if self.log_x {
                10f64.powf(x0 + (x1 - x0) * fraction)
            } else {
                x0 + (x1 - x0) * fraction
            };
            let _ = writeln!(
                out,
                r#"<text x="{p:.1}" y="{q}" text-anchor="middle">{}</text>"#,
                tick_label(x),
                p = px(x),
                q = HEIGHT - BOTTOM + 18.0
            );
        }
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text><text transform="translate(16 {}) rotate(-90)" text-anchor="middle">{}</text>"#,
            (LEFT + WIDTH - RIGHT) / 2.0,
            HEIGHT - 12.0,
            escape(&self.x_label),
            (TOP + HEIGHT - BOTTOM) / 2.0,
            escape(&self.y_label)
        );
        // One line per series, and its legend entry.
        for (i, (label, points)) in self.series.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let path: Vec<String> = points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
                path.join(" ")
            );
            // The legend runs in a row between the title and the chart.
            let x = LEFT + 200.0 * i as f64;
            let y = TOP - 20.0;
            let _ = writeln!(
                out,
                r#"<line x1="{x}" y1="{y}" x2="{b}" y2="{y}" stroke="{colour}" stroke-width="3"/><text x="{c}" y="{d}">{}</text>"#,
                escape(label),
                b = x + 20.0,
                c = x + 26.0,
                d = y + 4.0
            );
        }
        out.push_str("</svg>\n");
        out
    }
}

/// The cumulative distribution of `samples`: (value, share at or below).
pub fn cdf(samples: &[f64]) -> Vec<(f64, f64)> {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len() as f64;
    // About 400 points for the body: a line, not every sample; every
    // sample of the slowest 1%, where the tail is read.
    let step = (sorted.len() / 400).max(1);
    let tail = sorted.len() - sorted.len().div_ceil(100);
    let mut out: Vec<(f64, f64)> = sorted
        .iter()
        .enumerate()
        .filter(|(i, _)| i % step == 0 || *i >= tail)
        .map(|(i, &v)| (v, (i + 1) as f64 / n))
        .collect();
    if let Some(&last) = sorted.last() {
        out.push((last, 1.0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_has_a_line_per_series_and_escapes_its_text() {
        let plot = Plot {
            file: "x.svg".into(),
            title: "nodes <initialised>".into(),
            x_label: "s".into(),
            y_label: "nodes".into(),
            log_x: false,
            series: vec![
                ("ours".into(), vec![(0.0, 0.0), (1.0, 10.0)]),
                ("upstream".into(), vec![(0.0, 0.0), (5.0, 10.0)]),
            ],
        };
        let svg = plot.svg();
        assert!(svg.starts_with("<svg"), "{svg}");
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("nodes &lt;initialised&gt;"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }

    #[test]
    fn the_cdf_rises_to_one() {
        let c = cdf(&[3.0, 1.0, 2.0, 4.0]);
        assert_eq!(c.first(), Some(&(1.0, 0.25)));
        assert_eq!(c.last(), Some(&(4.0, 1.0)));
        assert!(c.windows(2).all(|w| w[0].1 <= w[1].1));
    }
}
