//! pgbench against a real PostgreSQL server whose data directory lives on the filesystem
//! under test. fsprof initialises the cluster, starts the server on a private socket (no
//! TCP), loads the pgbench tables untraced, traces the benchmark together with the server's
//! processes, and stops the server whatever happens.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

const USER: &str = "postgres";

#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct PgbenchSpec {
    /// pgbench -s: 100,000 rows of pgbench_accounts each.
    pub scale: u32,
    pub clients: u32,
    pub seconds: u32,
}

/// Newest PostgreSQL server binaries installed (Debian layout).
fn bin_dir() -> Result<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| anyhow::anyhow!("PostgreSQL is not installed: apt-get install postgresql"))?
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .filter(|(_, p): &(u32, PathBuf)| p.join("initdb").exists() && p.join("pgbench").exists())
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, p)| p)
        .context("no PostgreSQL with initdb and pgbench under /usr/lib/postgresql: apt-get install postgresql")
}

fn as_postgres(bin: &Path, prog: &str) -> Command {
    let mut c = Command::new("runuser");
    c.args(["-u", USER, "--"]).arg(bin.join(prog));
    c
}

fn check(cmd: &mut Command, what: &str) -> Result<()> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// A running server; stopped (and its socket directory removed) on drop.
pub struct PgServer {
    bin: PathBuf,
    data: PathBuf,
    pub socket_dir: PathBuf,
    pub pid: u32,
}

fn chown_postgres(path: &Path) -> Result<()> {
    check(
        Command::new("chown").args([USER, &path.display().to_string()]),
        "chown",
    )
}

impl PgServer {
    /// initdb in `mnt`/pgdata, start, and `pgbench -i` at `spec.scale`.
    pub fn start(mnt: &Path, spec: &PgbenchSpec) -> Result<PgServer> {
        let bin = bin_dir()?;
        let data = mnt.join("pgdata");
        fs::create_dir_all(&data)?;
        chown_postgres(&data)?;
        let socket_dir = PathBuf::from(format!("/run/fsprof/pg-{}", std::process::id()));
        fs::create_dir_all(&socket_dir)?;
        fs::set_permissions(&socket_dir, fs::Permissions::from_mode(0o755))?;
        chown_postgres(&socket_dir)?;
        check(
            as_postgres(&bin, "initdb").args(["-D", &data.display().to_string(), "-A", "trust"]),
            "initdb",
        )?;
        let mut server = PgServer {
            bin: bin.clone(),
            data: data.clone(),
            socket_dir: socket_dir.clone(),
            pid: 0,
        };
        let opts = format!("-k {} -c listen_addresses=''", socket_dir.display());
        check(
            as_postgres(&bin, "pg_ctl").args([
                "-D",
                &data.display().to_string(),
                "-o",
                &opts,
                "-l",
                &data.join("server.log").display().to_string(),
                "-w",
                "start",
            ]),
            "pg_ctl start",
        )?;
        let pidfile = fs::read_to_string(data.join("postmaster.pid"))?;
        server.pid = pidfile.lines().next().unwrap_or("").trim().parse()?;
        check(
            as_postgres(&bin, "pgbench")
                .args(["-i", "-q", "-s", &spec.scale.to_string(), "-h"])
                .arg(&socket_dir)
                .arg("postgres"),
            "pgbench -i",
        )?;
        Ok(server)
    }

    /// The traced command: pgbench, its report saved beside the socket.
    pub fn bench_command(&self, spec: &PgbenchSpec) -> Vec<String> {
        let pgbench = self.bin.join("pgbench");
        vec![
            "runuser".into(),
            "-u".into(),
            USER.into(),
            "--".into(),
            "sh".into(),
            "-c".into(),
            format!(
                "{} -h {} -c {} -j {} -T {} postgres > {}",
                pgbench.display(),
                self.socket_dir.display(),
                spec.clients,
                spec.clients.min(4),
                spec.seconds,
                self.report().display()
            ),
        ]
    }

    fn report(&self) -> PathBuf {
        self.socket_dir.join("pgbench.out")
    }

    /// Transactions per second from the last pgbench report.
    pub fn tps(&self) -> Option<f64> {
        let text = fs::read_to_string(self.report()).ok()?;
        text.lines()
            .find_map(|l| l.trim().strip_prefix("tps = "))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        let _ = as_postgres(&self.bin, "pg_ctl")
            .args([
                "-D",
                &self.data.display().to_string(),
                "-m",
                "fast",
                "-w",
                "stop",
            ])
            .output();
        let _ = fs::remove_dir_all(&self.socket_dir);
    }
}
