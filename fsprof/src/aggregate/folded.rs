//! Folded stacks (the FlameGraph tools' format: "frame;frame;… weight", weights in µs): the
//! kinds fsprof draws, folding a trace's stacks into them, and reading, writing and merging
//! the files. Drawing them is the report's business (`report::flame`).

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result, bail};
use fsprof_common::TimeClass;

use super::{
    stacks::{Stacks, WeightedStack, class_label},
    wakes,
};

/// Folded stacks: "frame;frame;… " → weight in µs.
pub type Folded = BTreeMap<String, u64>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    OnCpu,
    OffCpu,
    Combined,
    Background,
    /// Blocked stacks with the stack that woke them on top (Gregg's off-wake graph).
    OffWake,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::OnCpu,
        Kind::OffCpu,
        Kind::Combined,
        Kind::Background,
        Kind::OffWake,
    ];
    pub fn file_stem(self) -> &'static str {
        match self {
            Kind::OnCpu => "on-cpu",
            Kind::OffCpu => "off-cpu",
            Kind::Combined => "combined",
            Kind::Background => "background",
            Kind::OffWake => "off-wake",
        }
    }
    /// What the width of a frame means, for titles.
    pub fn width_means(self) -> &'static str {
        match self {
            Kind::OnCpu => "width = on-CPU time of the target (sampled), µs",
            Kind::OffCpu => "width = off-CPU time of the target's threads, µs",
            Kind::Combined => {
                "width = thread time of the target: on-CPU (warm) + off-CPU (blue), µs"
            }
            Kind::Background => {
                "width = on-CPU time of kernel threads working for the filesystem (sampled), µs"
            }
            Kind::OffWake => {
                "width = blocked time of the target's threads; above the [woken by …] frame, \
                 the waker's stack, leaf first, µs"
            }
        }
    }
}

fn clean(f: &str) -> String {
    f.replace(';', ":")
}

fn class_frame(class: u32) -> String {
    format!("[{}]", class_label(class))
}

/// kworker/u8:2 → kworker; jbd2/loop0-8 → jbd2/loop0-8 (named per device, keep).
fn thread_base(comm: &str) -> &str {
    if comm.starts_with("kworker") {
        "kworker"
    } else {
        comm
    }
}

fn push_frames(out: &mut Vec<String>, s: &WeightedStack, suffix_user: &str, suffix_k: &str) {
    out.extend(s.user.iter().map(|f| format!("{}{suffix_user}", clean(f))));
    out.extend(s.kernel.iter().map(|f| format!("{}{suffix_k}", clean(f))));
}

fn add(folded: &mut Folded, frames: Vec<String>, ns: u64) {
    let us = (ns + 500) / 1000;
    if us > 0 {
        *folded.entry(frames.join(";")).or_insert(0) += us;
    }
}

/// The folded stacks of one kind from a trace's stacks.
pub fn fold(stacks: &Stacks, kind: Kind) -> Folded {
    let mut f = Folded::new();
    let on = TimeClass::OnCpu as u32;
    match kind {
        Kind::OnCpu => {
            for s in stacks.target.iter().filter(|s| s.class == on) {
                let mut fr = vec![clean(&s.comm)];
                push_frames(&mut fr, s, "", "_[k]");
                add(&mut f, fr, s.ns);
            }
        }
        Kind::OffCpu => {
            for s in stacks.target.iter().filter(|s| s.class != on) {
                let mut fr = vec![clean(&s.comm), class_frame(s.class)];
                push_frames(&mut fr, s, "", "_[k]");
                add(&mut f, fr, s.ns);
            }
        }
        Kind::Combined => {
            for s in &stacks.target {
                let mut fr = vec![clean(&s.comm), class_frame(s.class)];
                if s.class == on {
                    push_frames(&mut fr, s, "", "_[k]");
                } else {
                    // `_[w]` marks off-CPU frames: drawn in blues, shown without the suffix.
                    fr[1].push_str("_[w]");
                    push_frames(&mut fr, s, "_[w]", "_[w]");
                }
                add(&mut f, fr, s.ns);
            }
        }
        Kind::OffWake => {
            // Blocked stack root → leaf (blues), a frame naming the waker and what the time
            // waited for, then the waker's stack from the wakeup (leaf) down to its root.
            let tgids: std::collections::HashSet<u32> =
                stacks.target.iter().map(|s| s.tgid).collect();
            let target = |t: u32| tgids.contains(&t);
            for e in &stacks.wakes {
                let mut fr = vec![clean(&e.comm), format!("{}_[w]", class_frame(e.class))];
                fr.extend(e.blocked_user.iter().map(|f| format!("{}_[w]", clean(f))));
                fr.extend(e.blocked_kernel.iter().map(|f| format!("{}_[w]", clean(f))));
                fr.push(format!("[{}]", clean(&wakes::waited_for(e, &target))));
                fr.extend(
                    e.waker_kernel
                        .iter()
                        .rev()
                        .map(|f| format!("{}_[k]", clean(f))),
                );
                fr.push(clean(thread_base(&e.waker_comm)));
                add(&mut f, fr, e.ns);
            }
        }
        Kind::Background => {
            for s in &stacks.background {
                let mut fr = vec![
                    format!("[{}]", s.group.as_deref().unwrap_or("kernel")),
                    clean(thread_base(&s.comm)),
                ];
                push_frames(&mut fr, s, "", "_[k]");
                add(&mut f, fr, s.ns);
            }
        }
    }
    f
}

pub fn total_us(f: &Folded) -> u64 {
    f.values().sum()
}

pub fn write_folded(f: &Folded, path: &Path) -> Result<()> {
    let mut text = String::new();
    for (stack, n) in f {
        text.push_str(stack);
        text.push(' ');
        text.push_str(&n.to_string());
        text.push('\n');
    }
    fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// Reads a folded file (as written by fsprof, perf script | stackcollapse, or bpftrace).
pub fn read_folded(path: &Path) -> Result<Folded> {
    let text = fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut f = Folded::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((stack, n)) = line.rsplit_once(' ') else {
            bail!("{}:{}: not a folded stack line", path.display(), i + 1);
        };
        let n: u64 = n
            .parse()
            .with_context(|| format!("{}:{}: bad count {n:?}", path.display(), i + 1))?;
        *f.entry(stack.to_string()).or_insert(0) += n;
    }
    Ok(f)
}

pub fn merge(into: &mut Folded, other: &Folded) {
    for (k, v) in other {
        *into.entry(k.clone()).or_insert(0) += v;
    }
}

/// Draws one kind's folded stacks as a picture at a path; false when there was nothing to
/// draw. The report layer provides it, so tracing does not depend on drawing.
pub type Renderer = fn(&Folded, Kind, &str, &Path) -> Result<bool>;

/// Writes the folded files and SVGs of every kind with data into `dir`, named
/// `{stem}.{kind}.folded|svg`; `title` says what was traced. Returns kind → path written.
pub fn write_all(
    stacks: &Stacks,
    dir: &Path,
    stem: &str,
    title: &str,
    svg: Option<Renderer>,
) -> Result<BTreeMap<String, PathBuf>> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut out = BTreeMap::new();
    for kind in Kind::ALL {
        let f = fold(stacks, kind);
        if f.is_empty() {
            continue;
        }
        let folded = dir.join(format!("{stem}.{}.folded", kind.file_stem()));
        write_folded(&f, &folded)?;
        out.insert(format!("{}.folded", kind.file_stem()), folded);
        let Some(render) = svg else {
            continue;
        };
        let svg = dir.join(format!("{stem}.{}.svg", kind.file_stem()));
        let t = format!("{title} · {}", kind_title(kind));
        if render(&f, kind, &t, &svg)? {
            out.insert(format!("{}.svg", kind.file_stem()), svg);
        }
    }
    Ok(out)
}

pub fn kind_title(kind: Kind) -> &'static str {
    match kind {
        Kind::OnCpu => "on-CPU",
        Kind::OffCpu => "off-CPU",
        Kind::Combined => "on- and off-CPU",
        Kind::Background => "kernel background work",
        Kind::OffWake => "off-CPU with wakers",
    }
}
