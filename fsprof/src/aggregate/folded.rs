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
    symbols::{At, located},
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

/// The time class a frame names (`[I/O wait]`), as `class_frame` spells it.
pub fn class_of_frame(frame: &str) -> Option<TimeClass> {
    let label = frame.strip_prefix('[')?.strip_suffix(']')?;
    TimeClass::ALL
        .iter()
        .copied()
        .find(|&c| class_label(c as u32) == label)
}

/// kworker/u8:2 → kworker; jbd2/loop0-8 → jbd2/loop0-8 (named per device, keep).
fn thread_base(comm: &str) -> &str {
    if comm.starts_with("kworker") {
        "kworker"
    } else {
        comm
    }
}

/// How a graph draws a frame: as it is, as kernel code (`_[k]`), or as time off-CPU (`_[w]`,
/// in blues, shown without the suffix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    Plain,
    Kernel,
    Waiting,
}

impl Mark {
    fn suffix(self) -> &'static str {
        match self {
            Mark::Plain => "",
            Mark::Kernel => "_[k]",
            Mark::Waiting => "_[w]",
        }
    }
}

/// One stack of a kind as the graphs and exports show it.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Root first: name (as the kernel or the symbols have it), mark, where its code is.
    pub frames: Vec<(String, Mark, At)>,
    pub ns: u64,
    /// Samples (on-CPU) or intervals (off-CPU).
    pub count: u64,
    /// The thread the time is of (for off-wake: the blocked one); its process (0: unknown).
    pub comm: String,
    pub tgid: u32,
    /// Its class (TimeClass or STACK_CLASS_BACKGROUND).
    pub class: u32,
}

fn named(name: String, mark: Mark) -> (String, Mark, At) {
    (name, mark, At::Nowhere)
}

fn stack_frames(s: &WeightedStack, user: Mark, kernel: Mark) -> Vec<(String, Mark, At)> {
    let u = located(&s.user, &s.user_at).map(|(n, at)| (n.to_string(), user, at));
    let k = located(&s.kernel, &s.kernel_at).map(|(n, at)| (n.to_string(), kernel, at));
    u.chain(k).collect()
}

fn sample_of(
    s: &WeightedStack,
    mut frames: Vec<(String, Mark, At)>,
    user: Mark,
    kernel: Mark,
) -> Sample {
    frames.extend(stack_frames(s, user, kernel));
    Sample {
        frames,
        ns: s.ns,
        count: s.count,
        comm: s.comm.clone(),
        tgid: s.tgid,
        class: s.class,
    }
}

/// The target's stacks of one kind: the thread's frame, then its class's unless on-CPU.
fn target_samples(stacks: &Stacks, kind: Kind) -> Vec<Sample> {
    let on = TimeClass::OnCpu as u32;
    let wanted = |s: &&WeightedStack| match kind {
        Kind::OnCpu => s.class == on,
        Kind::OffCpu => s.class != on,
        _ => true,
    };
    let plain = Mark::Plain;
    stacks
        .target
        .iter()
        .filter(wanted)
        .map(|s| {
            let mut head = vec![named(s.comm.clone(), plain)];
            match (kind, s.class == on) {
                (Kind::OnCpu, _) => sample_of(s, head, plain, Mark::Kernel),
                (Kind::Combined, false) => {
                    head.push(named(class_frame(s.class), Mark::Waiting));
                    sample_of(s, head, Mark::Waiting, Mark::Waiting)
                }
                _ => {
                    head.push(named(class_frame(s.class), plain));
                    sample_of(s, head, plain, Mark::Kernel)
                }
            }
        })
        .collect()
}

/// Blocked stack root → leaf (blues), a frame naming the waker and what the time waited
/// for, then the waker's stack from the wakeup (leaf) down to its root.
fn off_wake_samples(stacks: &Stacks) -> Vec<Sample> {
    let tgids: std::collections::HashSet<u32> = stacks.target.iter().map(|s| s.tgid).collect();
    let target = |t: u32| tgids.contains(&t);
    let w = Mark::Waiting;
    stacks
        .wakes
        .iter()
        .map(|e| {
            let mut fr = vec![
                named(e.comm.clone(), Mark::Plain),
                named(class_frame(e.class), w),
            ];
            fr.extend(
                located(&e.blocked_user, &e.blocked_user_at).map(|(n, at)| (n.to_string(), w, at)),
            );
            fr.extend(
                located(&e.blocked_kernel, &e.blocked_kernel_at)
                    .map(|(n, at)| (n.to_string(), w, at)),
            );
            fr.push(named(
                format!("[{}]", wakes::waited_for(e, &target)),
                Mark::Plain,
            ));
            let waker: Vec<_> = located(&e.waker_kernel, &e.waker_kernel_at).collect();
            fr.extend(
                waker
                    .into_iter()
                    .rev()
                    .map(|(n, at)| (n.to_string(), Mark::Kernel, at)),
            );
            fr.push(named(thread_base(&e.waker_comm).to_string(), Mark::Plain));
            Sample {
                frames: fr,
                ns: e.ns,
                count: e.count,
                comm: e.comm.clone(),
                tgid: 0,
                class: e.class,
            }
        })
        .collect()
}

/// Every stack of one kind, as the graphs and exports show it.
pub fn samples(stacks: &Stacks, kind: Kind) -> Vec<Sample> {
    match kind {
        Kind::OnCpu | Kind::OffCpu | Kind::Combined => target_samples(stacks, kind),
        Kind::OffWake => off_wake_samples(stacks),
        Kind::Background => stacks
            .background
            .iter()
            .map(|s| {
                let head = vec![
                    named(
                        format!("[{}]", s.group.as_deref().unwrap_or("kernel")),
                        Mark::Plain,
                    ),
                    named(thread_base(&s.comm).to_string(), Mark::Plain),
                ];
                sample_of(s, head, Mark::Plain, Mark::Kernel)
            })
            .collect(),
    }
}

/// The folded stacks of one kind from a trace's stacks (weights in µs, each stack's
/// rounded; frames with `;` get `:`, as the format needs).
pub fn fold(stacks: &Stacks, kind: Kind) -> Folded {
    let mut f = Folded::new();
    for s in samples(stacks, kind) {
        let us = (s.ns + 500) / 1000;
        if us > 0 {
            let frames: Vec<String> = s
                .frames
                .iter()
                .map(|(n, m, _)| format!("{}{}", clean(n), m.suffix()))
                .collect();
            *f.entry(frames.join(";")).or_insert(0) += us;
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
