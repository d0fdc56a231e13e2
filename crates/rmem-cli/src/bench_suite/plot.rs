//! Plots in the style of DLM Figs. 6-11: a workload's time relative to local memory against
//! the local ratio, one line per system and page size, log scale; PNG and SVG.

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

const SIZE: (u32, u32) = (800, 560);

fn draw<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    title: &str,
    lines: &[Line],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    let y_max = lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(2.0f64, f64::max)
        * 1.5;
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..105f64, (0.5f64..y_max).log_scale())
        .map_err(e)?;
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
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, color.filled())))
            .map_err(e)?;
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

/// Write `DIR/STEM.png` and `DIR/STEM.svg`.
pub fn write(dir: &Path, stem: &str, title: &str, lines: &[Line]) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let png = dir.join(format!("{stem}.png"));
    let svg = dir.join(format!("{stem}.svg"));
    draw(
        BitMapBackend::new(&png, SIZE).into_drawing_area(),
        title,
        lines,
    )
    .map_err(|e| format!("{}: {e}", png.display()))?;
    draw(
        SVGBackend::new(&svg, SIZE).into_drawing_area(),
        title,
        lines,
    )
    .map_err(|e| format!("{}: {e}", svg.display()))
}
