//! Which kernel a VM boots, and where its image and modules are.

use std::{
    fmt, fs,
    path::{Path, PathBuf},
    process::Command,
    str::FromStr,
};

use anyhow::{Context, Result, bail};

/// `--kernel`: `host` (no VM), a kernel image path, or `deb:PACKAGE[=VERSION]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelSpec {
    Host,
    Image(PathBuf),
    Deb(String),
}

impl FromStr for KernelSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "host" {
            return Ok(KernelSpec::Host);
        }
        if let Some(pkg) = s.strip_prefix("deb:") {
            let name = pkg.split('=').next().unwrap_or_default();
            if !name.starts_with("linux-image-") {
                return Err(format!(
                    "{s:?}: a Debian kernel package is linux-image-… (e.g. deb:linux-image-amd64)"
                ));
            }
            return Ok(KernelSpec::Deb(pkg.to_string()));
        }
        let p = PathBuf::from(s);
        if !p.is_file() {
            return Err(format!(
                "kernel {s:?}: not `host`, `deb:PACKAGE` or an existing kernel image"
            ));
        }
        Ok(KernelSpec::Image(p))
    }
}

impl fmt::Display for KernelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelSpec::Host => f.write_str("host"),
            KernelSpec::Image(p) => write!(f, "{}", p.display()),
            KernelSpec::Deb(p) => write!(f, "deb:{p}"),
        }
    }
}

/// A bootable kernel: its image and the `lib/modules` directory that holds `release`.
#[derive(Clone, Debug)]
pub struct GuestKernel {
    pub spec: String,
    pub release: String,
    pub vmlinuz: PathBuf,
    pub modules: PathBuf,
}

impl KernelSpec {
    /// The kernel to boot; None for the host's own. A Debian package is downloaded and
    /// unpacked under `cache` once.
    pub fn resolve(&self, cache: &Path) -> Result<Option<GuestKernel>> {
        match self {
            KernelSpec::Host => Ok(None),
            KernelSpec::Image(p) => image(p, &self.to_string()).map(Some),
            KernelSpec::Deb(pkg) => deb(pkg, cache, &self.to_string()).map(Some),
        }
    }
}

/// `vmlinuz-RELEASE` with its modules in `../lib/modules/RELEASE` (an unpacked package)
/// or `/lib/modules/RELEASE` (an installed one).
fn image(path: &Path, spec: &str) -> Result<GuestKernel> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let Some(release) = name
        .strip_prefix("vmlinuz-")
        .or_else(|| name.strip_prefix("bzImage-"))
    else {
        bail!(
            "kernel image {}: name it vmlinuz-RELEASE so its modules can be found",
            path.display()
        );
    };
    let boot = path.parent().unwrap_or(Path::new("/"));
    let root = boot.parent().unwrap_or(Path::new("/"));
    for modules in [
        root.join("lib/modules"),
        root.join("usr/lib/modules"),
        "/lib/modules".into(),
    ] {
        if modules.join(release).join("modules.dep").is_file() {
            return Ok(GuestKernel {
                spec: spec.to_string(),
                release: release.to_string(),
                vmlinuz: path.to_path_buf(),
                modules,
            });
        }
    }
    bail!(
        "kernel {}: no indexed modules for {release} beside it or in /lib/modules (run `depmod -b ROOT {release}`)",
        path.display()
    )
}

/// The Debian kernel package fsprof names when the host's kernel lacks a driver.
pub const DEBIAN_KERNEL: &str = "linux-image-amd64";

/// Where `pkg` (`name[=version]`) is unpacked: virtme-ng takes only `[A-Za-z0-9_+ /.-]` in
/// a shared directory's path (a backports version's `~` made it refuse `--rodir`), so every
/// other character becomes `_` (Debian's names and versions have no `_` of their own).
fn deb_dir(pkg: &str, cache: &Path) -> PathBuf {
    let safe = |c: char| c.is_ascii_alphanumeric() || "+.-".contains(c);
    cache.join(pkg.replace(|c| !safe(c), "_"))
}

/// The way on when the host kernel has no `driver`: Debian's kernel in a VM, and whether it
/// has the driver once it has been fetched into `cache` (its modules.dep and
/// modules.builtin say), so the advice is not a guess.
pub fn missing_driver_remedy(driver: &str, cache: &Path) -> String {
    let spec = format!("deb:{DEBIAN_KERNEL}");
    let Some(k) = unpacked(&deb_dir(DEBIAN_KERNEL, cache).join("root"), &spec) else {
        return format!(
            "boot Debian's kernel in a VM with `--kernel {spec}` (fetched once; \
             `fsprof list --kernel {spec}` says which filesystems it has)"
        );
    };
    if k.has_module(driver) {
        format!(
            "Debian's kernel {} has it: add `--kernel {spec}`",
            k.release
        )
    } else {
        format!(
            "nor has Debian's kernel {}: give `--kernel` a kernel image built with it",
            k.release
        )
    }
}

impl GuestKernel {
    /// Whether the kernel has `name` as a module or built in.
    pub fn has_module(&self, name: &str) -> bool {
        let dir = self.modules.join(&self.release);
        ["modules.dep", "modules.builtin"].iter().any(|f| {
            fs::read_to_string(dir.join(f)).is_ok_and(|t| {
                t.lines().any(|l| {
                    let path = l.split(':').next().unwrap_or_default();
                    let file = path.rsplit('/').next().unwrap_or_default();
                    file.split(".ko").next() == Some(name)
                })
            })
        })
    }
}

/// The digest of an unpacked tree, kept beside it when it was unpacked.
const TREE_DIGEST: &str = "tree.sha256";

/// SHA-256 over every path of `root` (sorted, links not followed) with its contents or
/// link target: what a VM boots, so a tree changed since apt's verified package was
/// unpacked is not booted (~1 s for a Debian kernel's 400 MB).
fn tree_digest(root: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut paths = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in fs::read_dir(&d).with_context(|| format!("reading {}", d.display()))? {
            let e = e?;
            match e.file_type()?.is_dir() {
                true => todo.push(e.path()),
                false => paths.push(e.path()),
            }
        }
    }
    paths.sort();
    let mut h = Sha256::new();
    for p in paths {
        h.update(
            p.strip_prefix(root)
                .unwrap_or(&p)
                .as_os_str()
                .as_encoded_bytes(),
        );
        match fs::read_link(&p) {
            Ok(target) => h.update(target.as_os_str().as_encoded_bytes()),
            Err(_) => h.update(fs::read(&p).with_context(|| format!("reading {}", p.display()))?),
        }
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The unpacked package under `dir`, if it is whole and unchanged since it was unpacked.
fn verified(dir: &Path, spec: &str) -> Option<GuestKernel> {
    let root = dir.join("root");
    let k = unpacked(&root, spec)?;
    let kept = fs::read_to_string(dir.join(TREE_DIGEST)).unwrap_or_default();
    if tree_digest(&root).ok()? == kept.trim() {
        return Some(k);
    }
    eprintln!(
        "fsprof: {} changed since it was unpacked (or was unpacked by an fsprof that kept no digest): unpacking it again",
        dir.display()
    );
    None
}

fn deb(pkg: &str, cache: &Path, spec: &str) -> Result<GuestKernel> {
    let dir = deb_dir(pkg, cache);
    let root = dir.join("root");
    if let Some(k) = verified(&dir, spec) {
        return Ok(k);
    }
    eprintln!("fsprof: fetching {pkg} into {}", dir.display());
    let part = cache.join(format!(
        ".{}-{}.part",
        dir.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&part);
    fs::create_dir_all(part.join("root"))
        .with_context(|| format!("creating {}", part.display()))?;
    let result = (|| {
        let mut want = pkg.to_string();
        // A metapackage (linux-image-amd64) points at the versioned image package.
        for _ in 0..3 {
            let file = download(&want, &part)?;
            run(Command::new("dpkg-deb")
                .arg("-x")
                .arg(&file)
                .arg(part.join("root")))?;
            if vmlinuz_in(&part.join("root")).is_some() {
                return Ok(());
            }
            let depends = output(
                Command::new("dpkg-deb")
                    .args(["-f"])
                    .arg(&file)
                    .arg("Depends"),
            )?;
            want = depends
                .split([',', '|'])
                .map(|d| d.split_whitespace().next().unwrap_or_default())
                .find(|d| d.starts_with("linux-image-"))
                .with_context(|| format!("{want}: no kernel image and no linux-image dependency"))?
                .to_string();
        }
        bail!("{pkg}: no kernel image after following its dependencies")
    })();
    if let Err(e) = result {
        let _ = fs::remove_dir_all(&part);
        return Err(e);
    }
    let release = vmlinuz_in(&part.join("root"))
        .and_then(|p| {
            Some(
                p.file_name()?
                    .to_string_lossy()
                    .strip_prefix("vmlinuz-")?
                    .to_string(),
            )
        })
        .context("kernel image name")?;
    run(Command::new("depmod")
        .arg("-b")
        .arg(part.join("root"))
        .arg(&release))?;
    for e in fs::read_dir(&part)?.flatten() {
        if e.path().extension().is_some_and(|x| x == "deb") {
            let _ = fs::remove_file(e.path());
        }
    }
    fs::write(part.join(TREE_DIGEST), tree_digest(&part.join("root"))?)?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&part, &dir)?;
    unpacked(&root, spec).context("unpacked kernel not found")
}

fn unpacked(root: &Path, spec: &str) -> Option<GuestKernel> {
    image(&vmlinuz_in(root)?, spec).ok()
}

fn vmlinuz_in(root: &Path) -> Option<PathBuf> {
    fs::read_dir(root.join("boot"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
}

/// `apt-get download` into `dir`; the path of the .deb it wrote.
fn download(pkg: &str, dir: &Path) -> Result<PathBuf> {
    let before: Vec<_> = debs(dir);
    run(Command::new("apt-get")
        .args(["download", "-q", pkg])
        .current_dir(dir))
    .with_context(|| format!("downloading {pkg} (apt-get download)"))?;
    debs(dir)
        .into_iter()
        .find(|d| !before.contains(d))
        .with_context(|| format!("apt-get download {pkg} wrote no .deb"))
}

fn debs(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|r| {
            r.flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "deb"))
                .collect()
        })
        .unwrap_or_default()
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rfind(|l| !l.trim().is_empty() && !l.starts_with("W:"));
        bail!(
            "{:?} failed: {}",
            cmd.get_program(),
            last.unwrap_or("").trim()
        );
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_directories_are_paths_virtme_ng_takes() {
        let dir = deb_dir("linux-image-amd64=6.12.95-1~bpo12+1", Path::new("/k"));
        assert_eq!(dir, Path::new("/k/linux-image-amd64_6.12.95-1_bpo12+1"));
        let other = deb_dir("linux-image-6.12.57+deb13-amd64:amd64", Path::new("/k"));
        assert_eq!(other, Path::new("/k/linux-image-6.12.57+deb13-amd64_amd64"));
    }

    /// An unpacked tree is booted only while its files are those it was unpacked with.
    #[test]
    fn a_tree_changed_since_it_was_unpacked_is_not_used() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("root");
        fs::create_dir_all(root.join("boot")).unwrap();
        fs::create_dir_all(root.join("lib/modules/6.1.0-9-amd64")).unwrap();
        fs::write(root.join("boot/vmlinuz-6.1.0-9-amd64"), b"kernel").unwrap();
        let dep = root.join("lib/modules/6.1.0-9-amd64/modules.dep");
        fs::write(&dep, b"kernel/fs/jfs/jfs.ko:\n").unwrap();
        assert!(
            verified(dir.path(), "deb:x").is_none(),
            "no digest kept yet"
        );
        fs::write(dir.path().join(TREE_DIGEST), tree_digest(&root).unwrap()).unwrap();
        assert!(verified(dir.path(), "deb:x").is_some());
        fs::write(&dep, b"kernel/fs/jfs/jfs.ko:\nevil.ko:\n").unwrap();
        assert!(verified(dir.path(), "deb:x").is_none(), "a changed file");
        fs::write(&dep, b"kernel/fs/jfs/jfs.ko:\n").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("boot/extra")).unwrap();
        assert!(verified(dir.path(), "deb:x").is_none(), "an added link");
    }

    #[test]
    fn specs_parse_and_bad_ones_say_why() {
        assert_eq!("host".parse::<KernelSpec>(), Ok(KernelSpec::Host));
        assert_eq!(
            "deb:linux-image-amd64".parse::<KernelSpec>(),
            Ok(KernelSpec::Deb("linux-image-amd64".into()))
        );
        assert!(
            "deb:bash"
                .parse::<KernelSpec>()
                .unwrap_err()
                .contains("linux-image-")
        );
        assert!(
            "/no/such/vmlinuz"
                .parse::<KernelSpec>()
                .unwrap_err()
                .contains("existing kernel image")
        );
    }

    #[test]
    fn the_remedy_for_a_missing_driver_says_what_debians_kernel_has() {
        let cache = std::env::temp_dir().join(format!("fsprof-kcache-{}", std::process::id()));
        let _ = fs::remove_dir_all(&cache);
        let spec = format!("deb:{DEBIAN_KERNEL}");
        assert!(missing_driver_remedy("jfs", &cache).contains(&format!("`--kernel {spec}`")));
        // A fetched kernel: its modules say which drivers it has.
        let root = deb_dir(DEBIAN_KERNEL, &cache).join("root");
        let modules = root.join("lib/modules/6.1.0-9-amd64");
        fs::create_dir_all(&modules).unwrap();
        fs::create_dir_all(root.join("boot")).unwrap();
        fs::write(root.join("boot/vmlinuz-6.1.0-9-amd64"), "").unwrap();
        fs::write(
            modules.join("modules.dep"),
            "kernel/fs/jfs/jfs.ko.xz:\nkernel/fs/nilfs2/nilfs2.ko: kernel/lib/x.ko\n",
        )
        .unwrap();
        fs::write(modules.join("modules.builtin"), "kernel/fs/ext4/ext4.ko\n").unwrap();
        let has = missing_driver_remedy("jfs", &cache);
        let lacks = missing_driver_remedy("reiserfs", &cache);
        let builtin = missing_driver_remedy("ext4", &cache);
        let _ = fs::remove_dir_all(&cache);
        assert!(
            has.contains("6.1.0-9-amd64 has it") && has.contains(&spec),
            "{has}"
        );
        assert!(lacks.starts_with("nor has"), "{lacks}");
        assert!(builtin.contains("has it"), "{builtin}");
    }
}
