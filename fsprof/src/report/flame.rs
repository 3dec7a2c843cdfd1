//! Flame graph pictures drawn with inferno from folded stacks (`aggregate::folded`): on-CPU,
//! off-CPU (towers per off-CPU class), combined (on- and off-CPU time in one picture,
//! off-CPU frames in blues), background (kernel threads' work for the filesystem), and
//! differential graphs between two folded sets.

use std::{fs, io::BufReader, path::Path};

use anyhow::{Context, Result};
use inferno::flamegraph::{self, Options, color::Color, color::PaletteMap};

use fsprof_common::TimeClass;

use crate::aggregate::folded::{self, Folded, Kind, total_us};

fn hash(s: &str) -> u32 {
    // FNV-1a: stable across runs, so a function keeps its shade in every graph.
    s.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ b as u32).wrapping_mul(0x0100_0193)
    })
}

fn shade(name: &str, base: (u8, u8, u8), spread: (u8, u8, u8)) -> Color {
    let h = hash(name);
    let v = |b: u8, s: u8, k: u32| b.saturating_add(((h >> k) % (s as u32 + 1)) as u8);
    Color {
        r: v(base.0, spread.0, 0),
        g: v(base.1, spread.1, 8),
        b: v(base.2, spread.2, 16),
    }
}

/// A class frame's colour, by its time class (not by the label's text).
fn class_color(frame: &str) -> Option<Color> {
    let (r, g, b) = match folded::class_of_frame(frame)? {
        TimeClass::OnCpu => (230, 90, 40),
        TimeClass::IoWait => (30, 90, 220),
        TimeClass::Uninterruptible => (130, 60, 200),
        TimeClass::Sleep => (140, 150, 170),
        TimeClass::RunQueue => (220, 190, 40),
        // Drawn as fsprof's other marker frames are.
        TimeClass::Steal => return None,
        TimeClass::Other => (150, 150, 150),
    };
    Some(Color { r, g, b })
}

/// A color for every frame: class frames by class, off-CPU frames in blues, kernel frames
/// in oranges, user frames in reds and yellows (the FlameGraph "java" convention).
fn palette(folded: &Folded, kind: Kind) -> PaletteMap {
    let mut map = PaletteMap::default();
    for stack in folded.keys() {
        for f in stack.split(';') {
            if map.get(f).is_some() {
                continue;
            }
            let plain = f.strip_suffix("_[w]").unwrap_or(f);
            let color = if let Some(c) = class_color(plain) {
                c
            } else if f.ends_with("_[w]") || (kind == Kind::OffCpu && !f.starts_with('[')) {
                shade(f, (40, 100, 200), (60, 80, 55))
            } else if f.ends_with("_[k]") {
                shade(f, (200, 110, 0), (55, 70, 40))
            } else if f.starts_with('[') {
                shade(f, (90, 160, 90), (40, 60, 40))
            } else {
                shade(f, (205, 50, 30), (50, 150, 40))
            };
            map.insert(f, color);
        }
    }
    map
}

fn lines(f: &Folded) -> Vec<String> {
    f.iter().map(|(k, v)| format!("{k} {v}")).collect()
}

fn options<'a>(title: &str, subtitle: &str, palette: Option<&'a mut PaletteMap>) -> Options<'a> {
    let mut o = Options::default();
    o.title = title.to_string();
    o.subtitle = Some(subtitle.to_string());
    o.count_name = "µs".to_string();
    o.palette_map = palette;
    o.hash = true;
    o.deterministic = true;
    o
}

/// Renders `folded` as an SVG; returns false (and writes nothing) when it is empty.
pub fn render(folded: &Folded, kind: Kind, title: &str, path: &Path) -> Result<bool> {
    if total_us(folded) == 0 {
        return Ok(false);
    }
    let mut map = palette(folded, kind);
    let mut opts = options(title, kind.width_means(), Some(&mut map));
    let l = lines(folded);
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut opts, l.iter().map(String::as_str), &mut svg)
        .with_context(|| format!("rendering {}", path.display()))?;
    write_file(path, &svg)?;
    Ok(true)
}

/// The differential folded lines ("stack before after") of two folded sets.
pub fn diff_lines(before: &Folded, after: &Folded) -> Result<String> {
    let mut out = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options::default(),
        BufReader::new(lines(before).join("\n").as_bytes()),
        BufReader::new(lines(after).join("\n").as_bytes()),
        &mut out,
    )?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// A differential graph: shapes and widths from `after`, red where `after` spent more time
/// than `before`, blue where less, white where the same. Nothing is drawn (false) when
/// `after` has no time: there is no shape to colour (a short step may have no on-CPU sample
/// on one filesystem and some on another).
pub fn render_diff(
    before: &Folded,
    after: &Folded,
    title: &str,
    subtitle: &str,
    path: &Path,
) -> Result<bool> {
    if total_us(after) == 0 {
        return Ok(false);
    }
    let d = diff_lines(before, after)?;
    let mut opts = options(title, subtitle, None);
    let mut svg = Vec::new();
    flamegraph::from_lines(&mut opts, d.lines(), &mut svg)
        .with_context(|| format!("rendering {}", path.display()))?;
    write_file(path, &svg)?;
    Ok(true)
}

/// In one write: inferno writes each XML token unbuffered, which costs a round trip per
/// token on a VM's shared directory.
fn write_file(path: &Path, bytes: &[u8]) -> Result<()> {
    fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{
        folded::{fold, read_folded, write_all},
        stacks::{Stacks, WeightedStack},
    };

    #[test]
    fn a_diff_against_nothing_draws_nothing() {
        let dir = std::env::temp_dir().join(format!("fsprof-diff-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let mut some = Folded::new();
        some.insert("rm;main".to_string(), 5000);
        let none = Folded::new();
        let svg = dir.join("d.svg");
        assert!(!render_diff(&some, &none, "t", "s", &svg).unwrap());
        assert!(render_diff(&none, &some, "t", "s", &svg).unwrap());
        let mut zero = Folded::new();
        zero.insert("rm;main".to_string(), 0);
        assert!(!render(&zero, Kind::OnCpu, "t", &svg).unwrap());
        fs::remove_dir_all(&dir).unwrap();
    }

    fn stacks() -> Stacks {
        let s = |class, ns, k: &[&str]| WeightedStack {
            comm: "rm".into(),
            class,
            kernel: k.iter().map(|x| x.to_string()).collect(),
            user: vec!["main".into()],
            ns,
            count: 1,
            ..Default::default()
        };
        Stacks {
            target: vec![
                s(0, 3_000_000, &["do_unlinkat", "xfs_remove"]),
                s(2, 5_000_000, &["do_unlinkat", "xfs_buf_iowait", "schedule"]),
            ],
            ..Default::default()
        }
    }

    #[test]
    fn folds_and_renders() {
        let st = stacks();
        let on = fold(&st, Kind::OnCpu);
        assert_eq!(
            on.get("rm;main;do_unlinkat_[k];xfs_remove_[k]"),
            Some(&3000)
        );
        let off = fold(&st, Kind::OffCpu);
        assert_eq!(
            off.get("rm;[other D-wait];main;do_unlinkat_[k];xfs_buf_iowait_[k];schedule_[k]"),
            Some(&5000)
        );
        let comb = fold(&st, Kind::Combined);
        assert_eq!(total_us(&comb), 8000);
        assert!(
            comb.keys()
                .any(|k| k.contains("[other D-wait]_[w];main_[w]"))
        );
        let dir = std::env::temp_dir().join(format!("fsprof-flame-test-{}", std::process::id()));
        let files = write_all(&st, &dir, "t", "xfs · rm", Some(render)).unwrap();
        let svg = fs::read_to_string(&files["combined.svg"]).unwrap();
        assert!(svg.contains("xfs · rm · on- and off-CPU"));
        let back = read_folded(&files["off-cpu.folded"]).unwrap();
        assert_eq!(back, off);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn class_frames_are_coloured_by_their_class() {
        let frame = |c: TimeClass| format!("[{}]", crate::aggregate::stacks::class_label(c as u32));
        assert_eq!(
            folded::class_of_frame(&frame(TimeClass::IoWait)),
            Some(TimeClass::IoWait)
        );
        assert_eq!(folded::class_of_frame("[kernel]"), None);
        let io = class_color(&frame(TimeClass::IoWait)).unwrap();
        assert_eq!((io.r, io.g, io.b), (30, 90, 220));
        let d = class_color(&frame(TimeClass::Uninterruptible)).unwrap();
        assert_eq!((d.r, d.g, d.b), (130, 60, 200));
        assert!(class_color(&frame(TimeClass::Steal)).is_none());
    }

    #[test]
    fn self_diff_has_no_change() {
        let off = fold(&stacks(), Kind::Combined);
        let d = diff_lines(&off, &off).unwrap();
        for l in d.lines() {
            let mut it = l.rsplitn(3, ' ');
            let (a, b) = (it.next().unwrap(), it.next().unwrap());
            assert_eq!(a, b, "{l}");
        }
    }
}
