//! Plots, PNG and SVG, log scale: in the style of DLM Figs. 6-11, a workload's time relative
//! to local memory against the local ratio, one line per system and page size ([`write`]);
//! and grouped bars of ratios against an anchor, one group per job ([`bars`]).

use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// One line: its label and (local ratio in percent, time relative to local) points.
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0x8c, 0x56, 0x4b),
];

/// One series of a bar chart: its label and a value per group (None: not measured).
pub struct Bars {
    pub label: String,
    pub values: Vec<Option<f64>>,
}

/// What a figure shows.
enum Figure<'a> {
    Lines(&'a [Line]),
    Bars {
        y_desc: &'a str,
        groups: &'a [String],
        series: &'a [Bars],
    },
}

fn draw<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    title: &str,
    figure: &Figure,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    let values: Vec<f64> = match figure {
        Figure::Lines(lines) => lines
            .iter()
            .flat_map(|l| l.points.iter().map(|p| p.1))
            .collect(),
        Figure::Bars { series, .. } => series
            .iter()
            .flat_map(|s| s.values.iter().flatten().copied())
            .collect(),
    };
    let (x_range, y_range) = match figure {
        Figure::Lines(_) => (
            0f64..105f64,
            0.5..values.iter().copied().fold(2.0, f64::max) * 1.5,
        ),
        Figure::Bars { groups, .. } => (
            0f64..groups.len() as f64,
            // Room above for the legend.
            values.iter().copied().fold(1.0, f64::min).max(1e-3) / 2.0
                ..values.iter().copied().fold(1.0, f64::max) * 4.0,
        ),
    };
    let y_min = y_range.start;
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x_range.clone(), y_range.log_scale())
        .map_err(e)?;
    match figure {
        Figure::Lines(lines) => {
            chart
                .configure_mesh()
                .x_desc("local memory, % of the data")
                .y_desc("time relative to local memory")
                .draw()
                .map_err(e)?;
            for (i, line) in lines.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                let mut pts = line.points.clone();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .map_err(e)?
                    .label(line.label.clone())
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
                    .map_err(e)?;
            }
        }
        Figure::Bars {
            y_desc,
            groups,
            series,
        } => {
            // Labels at the middle of each group, none elsewhere.
            let label = |x: &f64| {
                let i = x.floor() as usize;
                if (x - x.floor() - 0.5).abs() < 1e-6 && i < groups.len() {
                    groups[i].clone()
                } else {
                    String::new()
                }
            };
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(groups.len() * 2 + 1)
                .x_label_formatter(&label)
                .y_desc(*y_desc)
                .draw()
                .map_err(e)?;
            // The anchor's level.
            chart
                .draw_series(LineSeries::new(
                    [(0.0, 1.0), (x_range.end, 1.0)],
                    BLACK.stroke_width(1),
                ))
                .map_err(e)?;
            let width = 0.8 / series.len().max(1) as f64;
            for (k, s) in series.iter().enumerate() {
                let color = COLORS[k % COLORS.len()];
                let bars = s.values.iter().enumerate().filter_map(|(i, v)| {
                    let x0 = i as f64 + 0.1 + k as f64 * width;
                    v.map(|v| Rectangle::new([(x0, y_min), (x0 + width * 0.9, v)], color.filled()))
                });
                chart
                    .draw_series(bars)
                    .map_err(e)?
                    .label(s.label.clone())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled())
                    });
            }
        }
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(e)?;
    area.present().map_err(e)
}

/// Write `DIR/STEM.png` and `DIR/STEM.svg` of `size` pixels.
fn write_figure(
    dir: &Path,
    stem: &str,
    size: (u32, u32),
    title: &str,
    figure: &Figure,
) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let png = dir.join(format!("{stem}.png"));
    let svg = dir.join(format!("{stem}.svg"));
    draw(
        BitMapBackend::new(&png, size).into_drawing_area(),
        title,
        figure,
    )
    .map_err(|e| format!("{}: {e}", png.display()))?;
    draw(
        SVGBackend::new(&svg, size).into_drawing_area(),
        title,
        figure,
    )
    .map_err(|e| format!("{}: {e}", svg.display()))
}

/// Write `DIR/STEM.png` and `DIR/STEM.svg`: time relative to local against the local ratio.
pub fn write(dir: &Path, stem: &str, title: &str, lines: &[Line]) -> Result<(), String> {
    write_figure(dir, stem, (800, 560), title, &Figure::Lines(lines))
}

/// Write `DIR/STEM.png` and `DIR/STEM.svg`: grouped bars, a line at 1 (the anchor).
pub fn bars(
    dir: &Path,
    stem: &str,
    title: &str,
    y_desc: &str,
    groups: &[String],
    series: &[Bars],
) -> Result<(), String> {
    let figure = Figure::Bars {
        y_desc,
        groups,
        series,
    };
    write_figure(dir, stem, (1000, 560), title, &figure)
}
