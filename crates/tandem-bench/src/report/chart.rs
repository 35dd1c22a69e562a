//! PNG and SVG charts with plotters, without system fonts: DejaVu Sans (from the `dejavu`
//! crate) is registered with plotters' `ab_glyph` text renderer once per process.

use std::path::{Path, PathBuf};
use std::sync::Once;

use anyhow::anyhow;
use plotters::coord::Shift;
use plotters::prelude::*;

const FONT: &str = "sans-serif";
const SIZE: (u32, u32) = (900, 540);

fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_err() {
            tracing::warn!("cannot register the chart font; charts will have no text");
        }
    });
}

/// A line chart: one series per system.
pub struct LineChart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub series: Vec<(String, Vec<(f64, f64)>)>,
}

/// A bar chart with an optional marker per bar (e.g. estimate vs measured).
pub struct BarChart<'a> {
    pub title: &'a str,
    pub y_label: &'a str,
    pub bar_name: &'a str,
    pub marker_name: &'a str,
    /// (label, bar value, marker value)
    pub bars: Vec<(String, f64, Option<f64>)>,
}

fn color(i: usize) -> RGBAColor {
    Palette99::pick(i).to_rgba()
}

fn nice_max(v: f64) -> f64 {
    if v.is_finite() && v > 0.0 {
        v * 1.1
    } else {
        1.0
    }
}

fn draw_line<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &LineChart) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let pts = c.series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
    for &(x, y) in pts {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1) = (0.0, 1.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let mut chart = ChartBuilder::on(root)
        .caption(c.title, (FONT, 22))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x0..x1, 0.0..nice_max(y1))
        .map_err(e)?;
    // Integer x values (turns) get one label each, without decimals.
    let integer_x = c.series.iter().flat_map(|(_, p)| p.iter()).all(|&(x, _)| x.fract() == 0.0);
    let x_fmt = |x: &f64| if integer_x { format!("{x:.0}") } else { format!("{x:.2}") };
    let n_labels = if integer_x { ((x1 - x0) as usize + 1).min(25) } else { 10 };
    chart
        .configure_mesh()
        .x_desc(c.x_label)
        .y_desc(c.y_label)
        .x_labels(n_labels)
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&|y| if y1 < 10.0 { format!("{y:.1}") } else { format!("{y:.0}") })
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(e)?;
    for (i, (name, p)) in c.series.iter().enumerate() {
        let col = color(i);
        chart
            .draw_series(LineSeries::new(p.clone(), col.stroke_width(2)))
            .map_err(e)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], col.stroke_width(2)));
        chart.draw_series(p.iter().map(|&q| Circle::new(q, 3, col.filled()))).map_err(e)?;
    }
    if !c.series.is_empty() {
        chart
            .configure_series_labels()
            .label_font((FONT, 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(e)?;
    }
    root.present().map_err(e)
}

fn draw_bars<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, c: &BarChart) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let n = c.bars.len().max(1);
    let y1 = c.bars.iter().map(|b| b.1.max(b.2.unwrap_or(0.0))).fold(0.0, f64::max);
    let labels: Vec<String> = c.bars.iter().map(|b| b.0.clone()).collect();
    let mut chart = ChartBuilder::on(root)
        .caption(c.title, (FONT, 22))
        .margin(15)
        .x_label_area_size(60)
        .y_label_area_size(70)
        // A segmented range `0..k` has k + 1 segments.
        .build_cartesian_2d((0..n - 1).into_segmented(), 0.0..nice_max(y1))
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(c.y_label)
        .label_style((FONT, 12))
        .axis_desc_style((FONT, 16))
        .x_labels(n)
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => labels.get(*i).cloned().unwrap_or_default(),
            SegmentValue::Last => String::new(),
        })
        .draw()
        .map_err(e)?;
    let bar = color(0);
    chart
        .draw_series(c.bars.iter().enumerate().map(|(i, b)| {
            let mut r =
                Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), b.1)], bar.filled());
            r.set_margin(0, 0, 12, 12);
            r
        }))
        .map_err(e)?
        .label(c.bar_name)
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], bar.filled()));
    if c.bars.iter().any(|b| b.2.is_some()) {
        let mk = color(1);
        chart
            .draw_series(
                c.bars.iter().enumerate().filter_map(|(i, b)| {
                    b.2.map(|m| Cross::new((SegmentValue::CenterOf(i), m), 8, mk.stroke_width(3)))
                }),
            )
            .map_err(e)?
            .label(c.marker_name)
            .legend(move |(x, y)| Cross::new((x + 8, y), 6, mk.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(e)?;
    root.present().map_err(e)
}

/// Writes `stem.png` and `stem.svg`; returns both paths.
fn write_both(
    stem: &Path,
    draw_png: impl FnOnce(&DrawingArea<BitMapBackend, Shift>) -> Result<(), String>,
    draw_svg: impl FnOnce(&DrawingArea<SVGBackend, Shift>) -> Result<(), String>,
) -> anyhow::Result<Vec<PathBuf>> {
    register_font();
    let png = stem.with_extension("png");
    let svg = stem.with_extension("svg");
    {
        let root = BitMapBackend::new(&png, SIZE).into_drawing_area();
        draw_png(&root).map_err(|e| anyhow!("drawing {}: {e}", png.display()))?;
    }
    {
        let root = SVGBackend::new(&svg, SIZE).into_drawing_area();
        draw_svg(&root).map_err(|e| anyhow!("drawing {}: {e}", svg.display()))?;
    }
    Ok(vec![png, svg])
}

/// Draws a line chart to `stem.png` and `stem.svg`.
pub fn line_chart(stem: &Path, c: &LineChart) -> anyhow::Result<Vec<PathBuf>> {
    write_both(stem, |r| draw_line(r, c), |r| draw_line(r, c))
}

/// Draws a bar chart to `stem.png` and `stem.svg`.
pub fn bar_chart(stem: &Path, c: &BarChart) -> anyhow::Result<Vec<PathBuf>> {
    write_both(stem, |r| draw_bars(r, c), |r| draw_bars(r, c))
}
