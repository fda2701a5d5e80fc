//! An SVG of per-layer hidden-state cosine against depth, one line per gated variant. The y axis
//! is `−log10(1 − cosine)`, labelled in cosine (0.9, 0.99, 0.999, …): higher is closer.

use std::fmt::Write;

/// One line of the plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub label: String,
    /// `(depth, cosine)`: depth = layers run (a chunk's output after layer `depth − 1`).
    pub points: Vec<(usize, f64)>,
}

const PLOT_WIDTH: f64 = 600.0;
const HEIGHT: f64 = 520.0;
const LEFT: f64 = 90.0;
/// Legend width per label character (12 px sans-serif, generous).
const LEGEND_CHAR: f64 = 7.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
/// Closest agreement the axis shows (cosine 1 − 1e-9).
const NINES_MAX: f64 = 9.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// `−log10(1 − cosine)` clamped to `[0, 9]` (cosine ≤ 0 at the bottom, ≥ 1 − 1e-9 at the top;
/// NaN at the bottom).
pub fn nines(cosine: f64) -> f64 {
    if cosine.is_nan() {
        return 0.0;
    }
    (-(1.0 - cosine).clamp(10f64.powf(-NINES_MAX), 1.0).log10()).clamp(0.0, NINES_MAX)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

fn tick_label(n: i64) -> String {
    match n {
        0 => "0".into(),
        1..=6 => format!("0.{}", "9".repeat(n as usize)),
        _ => format!("1−1e-{n}"),
    }
}

/// The plot as SVG text; `threshold` draws a dashed line at that cosine.
pub fn cosine_vs_depth_svg(title: &str, series: &[Series], threshold: Option<f64>) -> String {
    let max_depth = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .max()
        .unwrap_or(1)
        .max(1);
    let values = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| nines(p.1)))
        .chain(threshold.map(nines));
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (mut y_lo, mut y_hi) = if lo.is_finite() {
        (lo.floor(), hi.ceil())
    } else {
        (0.0, 1.0)
    };
    if y_hi <= y_lo {
        y_hi = y_lo + 1.0;
    }
    y_lo = y_lo.max(0.0);
    let longest = series
        .iter()
        .map(|s| s.label.chars().count())
        .max()
        .unwrap_or(0);
    let right = (50.0 + LEGEND_CHAR * longest as f64).max(120.0);
    let plot_w = PLOT_WIDTH;
    let width = LEFT + plot_w + right;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let x = |depth: f64| LEFT + plot_w * (depth - 0.5) / max_depth as f64;
    let y = |v: f64| TOP + plot_h * (1.0 - (v - y_lo) / (y_hi - y_lo));

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{HEIGHT}" viewBox="0 0 {width} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="28" font-size="16" text-anchor="middle">{}</text>"#,
        LEFT + plot_w / 2.0,
        escape(title)
    );
    // y grid and labels
    let mut n = y_lo as i64;
    while n as f64 <= y_hi {
        let yy = y(n as f64);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            yy + 4.0,
            tick_label(n)
        );
        n += 1;
    }
    // x ticks (at most ~16 labels)
    let step = max_depth.div_ceil(16).max(1);
    for d in (1..=max_depth).filter(|d| d % step == 0 || *d == 1) {
        let xx = x(d as f64);
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#999"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{d}</text>"##,
            TOP + plot_h,
            TOP + plot_h + 5.0,
            TOP + plot_h + 18.0
        );
    }
    let _ = writeln!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>"##
    );
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">layers run (depth of the chunk output)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 18.0
    );
    let _ = writeln!(
        s,
        r#"<text x="22" y="{:.1}" text-anchor="middle" transform="rotate(-90 22 {:.1})">hidden-state cosine vs fp32 reference (min over tokens)</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0
    );
    if let Some(t) = threshold {
        let yy = y(nines(t));
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#000" stroke-dasharray="6 4"/><text x="{:.1}" y="{:.1}" text-anchor="end">threshold {t}</text>"##,
            LEFT + plot_w,
            LEFT + plot_w - 4.0,
            yy - 4.0
        );
    }
    for (i, series) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let points: Vec<String> = series
            .points
            .iter()
            .map(|(d, c)| format!("{:.1},{:.1}", x(*d as f64), y(nines(*c))))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
        for (d, c) in &series.points {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"><title>{}: depth {d}, cosine {c:.9}</title></circle>"#,
                x(*d as f64),
                y(nines(*c)),
                escape(&series.label)
            );
        }
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = LEFT + plot_w + 15.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            lx + 20.0,
            lx + 26.0,
            ly + 4.0,
            escape(&series.label)
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nines_maps_cosine_to_log_distance_from_one() {
        assert!((nines(0.999) - 3.0).abs() < 1e-9);
        assert!((nines(0.9) - 1.0).abs() < 1e-9);
        assert_eq!(nines(1.0), NINES_MAX);
        assert_eq!(nines(-0.5), 0.0);
        assert_eq!(nines(f64::NAN), 0.0);
    }

    #[test]
    fn svg_has_one_line_per_series_with_escaped_labels() {
        let series = vec![
            Series {
                label: "fp16 <naive>".into(),
                points: vec![(1, 0.9999), (2, 0.999)],
            },
            Series {
                label: "fp32".into(),
                points: vec![(1, 0.9999999), (2, 0.999999)],
            },
        ];
        let svg = cosine_vs_depth_svg("t & u", &series, Some(0.999));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("fp16 &lt;naive&gt;") && svg.contains("t &amp; u"));
        assert!(svg.contains(">0.999<") && svg.contains("threshold 0.999"));
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
