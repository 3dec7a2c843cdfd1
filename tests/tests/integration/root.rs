//! Root in a shared place: no local user can make a root fsprof format, copy or boot a file
//! of theirs. An unprivileged user made by the test plants what it can; the decoy (a
//! root-owned file) keeps its bytes, and nothing is left mounted or attached.

use std::{
    os::unix::fs::{MetadataExt, PermissionsExt, symlink},
    path::{Path, PathBuf},
    process::Command,
};

use fsprof::lab::loopdev::{Image, LoopDevice};
use fsprof_tests::*;

const USER: &str = "fsprof-attacker";
const DECOY: &[u8] = b"decoy!!!\n";

/// The unprivileged user, made for the test (and removed with it if it made it).
struct Attacker {
    uid: u32,
    made: bool,
}

impl Attacker {
    fn new() -> Attacker {
        let made = !Command::new("id")
            .arg(USER)
            .output()
            .unwrap()
            .status
            .success();
        if made {
            let add = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    USER,
                ])
                .output()
                .unwrap();
            assert_success(&add);
        }
        let id = Command::new("id").args(["-u", USER]).output().unwrap();
        let uid = String::from_utf8_lossy(&id.stdout).trim().parse().unwrap();
        Attacker { uid, made }
    }

    /// `sh -c SCRIPT` as the user.
    fn sh(&self, script: &str) {
        let out = Command::new("runuser")
            .args(["-u", USER, "--", "sh", "-c", script])
            .output()
            .unwrap();
        assert_success(&out);
    }
}

impl Drop for Attacker {
    fn drop(&mut self) {
        if self.made {
            let _ = Command::new("userdel").arg(USER).output();
        }
    }
}

/// A root-owned file of 9 bytes, mode 0600, removed on drop.
struct Decoy(PathBuf);

impl Decoy {
    fn new(tag: &str) -> Decoy {
        let p = PathBuf::from(format!(
            "/var/tmp/fsprof-decoy-{tag}-{}",
            std::process::id()
        ));
        std::fs::write(&p, DECOY).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        Decoy(p)
    }

    fn assert_intact(&self) {
        let m = std::fs::metadata(&self.0).unwrap();
        assert_eq!(m.len(), DECOY.len() as u64, "the decoy grew");
        assert_eq!(std::fs::read(&self.0).unwrap(), DECOY, "the decoy changed");
    }
}

impl Drop for Decoy {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A directory removed (whoever owns it) on drop.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where `run_in` writes its results: the test's temporary directory, not `dir`.
fn results_of(dir: &Path) -> PathBuf {
    let name = dir.to_string_lossy().replace('/', "_");
    std::env::temp_dir().join(format!("fsprof-root-test{name}.json"))
}

/// `fsprof run` of one small step with `--dir dir`: its output.
fn run_in(dir: &Path) -> std::process::Output {
    Command::new(fsprof_bin())
        .args(["run", "--fs", "ext4", "--only", "extract-tree"])
        .args(["--scale", "0.01", "--passes", "1", "--no-history", "--dir"])
        .arg(dir)
        .arg("--json")
        .arg(results_of(dir))
        .output()
        .unwrap()
}

fn refused(out: &std::process::Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    eprintln!("{err}");
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(needle) && err.contains("--dir"),
        "{needle}: {err}"
    );
}

/// The reported attack: a user's world-writable directory full of symlinks named as
/// fsprof's images would be (every pid near ours) to a root-owned decoy. Before, the run
/// formatted the decoy; now the directory is refused, and the decoy keeps its 9 bytes.
pub fn a_users_directory_of_decoy_links_is_refused() {
    let attacker = Attacker::new();
    let decoy = Decoy::new("links");
    let dir = Dir(PathBuf::from(format!(
        "/var/tmp/fsprof-attack-{}",
        std::process::id()
    )));
    let d = dir.0.display().to_string();
    let me = std::process::id();
    attacker.sh(&format!(
        "mkdir {d} && chmod 0777 {d} && for p in $(seq {} {}); do ln -s {} {d}/fsprof-$p-ext4.img; done",
        me,
        me + 3000,
        decoy.0.display()
    ));
    let before = std::fs::read_dir(&dir.0).unwrap().count();
    let out = run_in(&dir.0);
    refused(
        &out,
        &format!("belongs to user {USER} (uid {})", attacker.uid),
    );
    decoy.assert_intact();
    assert_eq!(
        std::fs::read_dir(&dir.0).unwrap().count(),
        before,
        "fsprof wrote there"
    );
    assert!(!results_of(&dir.0).exists());
    assert_nothing_left_of(std::process::id());
}

/// `--dir` another user owns, one anybody can write, and one inside a user's directory:
/// refused, each in one line saying why and what to do. A new one is made 0700, root's.
pub fn work_directories_others_control_are_refused() {
    let attacker = Attacker::new();
    let base = Dir(PathBuf::from(format!(
        "/var/tmp/fsprof-dirs-{}",
        std::process::id()
    )));
    std::fs::create_dir(&base.0).unwrap();
    let theirs = base.0.join("theirs");
    let owned = Dir(PathBuf::from(format!(
        "/var/tmp/fsprof-owned-{}",
        std::process::id()
    )));
    attacker.sh(&format!("mkdir -m 0755 {}", owned.0.display()));
    refused(&run_in(&owned.0), "belongs to user");
    std::fs::create_dir(&theirs).unwrap();
    std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o777)).unwrap();
    refused(&run_in(&theirs), "writable by other users");
    // Root's directory inside the user's: the user could rename it away.
    let inside = owned.0.join("sub");
    std::fs::create_dir(&inside).unwrap();
    refused(&run_in(&inside), "belongs to user");
    // A fresh one is made, 0700 and root's, and the run works in it.
    let fresh = base.0.join("new/work");
    let out = run_in(&fresh);
    assert_success(&out);
    for d in [&fresh, &base.0.join("new")] {
        let m = std::fs::metadata(d).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o700), "{}", d.display());
    }
    let json = results_of(&fresh);
    checked(&[&json]);
    for ext in ["json", "csv", "html"] {
        let _ = std::fs::remove_file(json.with_extension(ext));
    }
    let _ = std::fs::remove_dir_all(json.with_extension("flames"));
    assert_nothing_left_of(std::process::id());
}

/// The race behind the attack: an image swapped for a link to the decoy between its
/// creation and the loop setup. The loop device is set up from the file fsprof made, so
/// the decoy is not what gets formatted.
pub fn an_image_swapped_for_a_link_before_attach_is_harmless() {
    let decoy = Decoy::new("swap");
    let dir = Dir(PathBuf::from(format!(
        "/var/tmp/fsprof-swap-{}",
        std::process::id()
    )));
    let image = Image::create(&dir.0, "swap", 64 << 20).unwrap();
    // The swap: the image moved away, a link to the decoy in its place.
    let moved = dir.0.join("moved.img");
    std::fs::rename(&image.path, &moved).unwrap();
    symlink(&decoy.0, &image.path).unwrap();
    let dev = LoopDevice::attach(&image).unwrap();
    let name = dev.path.file_name().unwrap().to_string_lossy().into_owned();
    let backing = std::fs::read_to_string(format!("/sys/block/{name}/loop/backing_file")).unwrap();
    assert_eq!(backing.trim(), moved.display().to_string());
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F"])
        .arg(&dev.path)
        .output()
        .unwrap();
    assert_success(&mkfs);
    decoy.assert_intact();
    let link = image.path.clone();
    drop(dev);
    drop(image);
    // Removed by its name: what stood there (the link) goes, not what it pointed to.
    assert!(
        std::fs::symlink_metadata(&link).is_err(),
        "{}",
        link.display()
    );
    assert!(moved.exists());
    decoy.assert_intact();
}
