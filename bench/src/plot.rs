//! An SVG of handoff latency against contenders, one line per setup.

use std::fmt::Write;
use std::path::PathBuf;

use crate::handoff::Point;

const XS: [usize; 3] = [2, 8, 32];

pub fn write(points: &[Point]) -> PathBuf {
    let (w, h, left, bottom) = (640.0, 400.0, 80.0, 50.0);
    let max_ms = points
        .iter()
        .map(|p| p.2.as_secs_f64() * 1e3)
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.1;
    let x = |n: usize| {
        left + (w - left - 20.0) * (XS.iter().position(|&v| v == n).unwrap_or(0) as f64) / 2.0
    };
    let y = |ms: f64| (h - bottom) - (h - bottom - 30.0) * ms / max_ms;
    let mut svg = format!(
        "<svg xmlns='http://www.w3.org/2000/svg' width='{w}' height='{h}' font-family='sans-serif' font-size='12'>\
         <rect width='100%' height='100%' fill='white'/>\
         <text x='{}' y='16' text-anchor='middle'>fencelock handoff latency (p50) against contenders</text>\
         <line x1='{left}' y1='{}' x2='{}' y2='{}' stroke='black'/>\
         <line x1='{left}' y1='24' x2='{left}' y2='{}' stroke='black'/>",
        w / 2.0,
        h - bottom,
        w - 20.0,
        h - bottom,
        h - bottom
    );
    for n in XS {
        let _ = write!(
            svg,
            "<text x='{}' y='{}' text-anchor='middle'>{n}</text>",
            x(n),
            h - bottom + 18.0
        );
    }
    let _ = write!(
        svg,
        "<text x='{}' y='{}' text-anchor='middle'>contenders</text>",
        w / 2.0,
        h - 10.0
    );
    for i in 0..=4 {
        let v = max_ms * f64::from(i) / 4.0;
        let _ = write!(
            svg,
            "<text x='{}' y='{}' text-anchor='end'>{v:.1} ms</text>",
            left - 6.0,
            y(v) + 4.0
        );
    }
    let colours = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728"];
    let mut labels: Vec<&str> = Vec::new();
    for p in points {
        if !labels.contains(&p.0.as_str()) {
            labels.push(&p.0);
        }
    }
    for (i, label) in labels.iter().enumerate() {
        let colour = colours[i % colours.len()];
        let line: Vec<String> = points
            .iter()
            .filter(|p| p.0 == *label)
            .map(|p| format!("{:.1},{:.1}", x(p.1), y(p.2.as_secs_f64() * 1e3)))
            .collect();
        let _ = write!(
            svg,
            "<polyline fill='none' stroke='{colour}' stroke-width='2' points='{}'/>",
            line.join(" ")
        );
        let _ = write!(
            svg,
            "<text x='{}' y='{}' fill='{colour}'>{label}</text>",
            left + 10.0,
            40.0 + 16.0 * i as f64
        );
    }
    svg.push_str("</svg>\n");
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("handoff.svg");
    std::fs::write(&path, svg).unwrap();
    path
}
