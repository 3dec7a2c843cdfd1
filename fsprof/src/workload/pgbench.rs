//! pgbench against a real PostgreSQL server whose data directory lives on the filesystem
//! under test. fsprof initialises the cluster, starts the server on a private socket (no
//! TCP), loads the pgbench tables untraced, traces the benchmark together with the server's
//! processes, and stops the server whatever happens.

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use super::rate::TPS;

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
    /// The TCP port, when it listens on one.
    pub port: Option<u16>,
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
        let server = PgServer::start_in(&mnt.join("pgdata"), None)?;
        check(
            as_postgres(&server.bin, "pgbench")
                .args(["-i", "-q", "-s", &spec.scale.to_string(), "-h"])
                .arg(&server.socket_dir)
                .arg("postgres"),
            "pgbench -i",
        )?;
        Ok(server)
    }

    /// initdb in `data` and start: on a socket of its own (trusted), and with `port` also on
    /// 127.0.0.1 (password authentication, scram-sha-256).
    pub fn start_in(data: &Path, port: Option<u16>) -> Result<PgServer> {
        static SERVERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let bin = bin_dir()?;
        fs::create_dir_all(data)?;
        chown_postgres(data)?;
        let n = SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let socket_dir = PathBuf::from(format!("/run/fsprof/pg-{}-{n}", std::process::id()));
        fs::create_dir_all(&socket_dir)?;
        fs::set_permissions(&socket_dir, fs::Permissions::from_mode(0o755))?;
        chown_postgres(&socket_dir)?;
        check(
            as_postgres(&bin, "initdb").args([
                "-D",
                &data.display().to_string(),
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
            ]),
            "initdb",
        )?;
        let mut server = PgServer {
            bin: bin.clone(),
            data: data.to_path_buf(),
            socket_dir: socket_dir.clone(),
            pid: 0,
            port: None,
        };
        let listen = match port {
            Some(p) => format!("-c listen_addresses=127.0.0.1 -p {p}"),
            None => "-c listen_addresses=''".to_string(),
        };
        let opts = format!("-k {} {listen}", socket_dir.display());
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
        server.port = port;
        let pidfile = fs::read_to_string(data.join("postmaster.pid"))?;
        server.pid = pidfile.lines().next().unwrap_or("").trim().parse()?;
        Ok(server)
    }

    /// Runs SQL as the superuser over the socket; returns what psql printed.
    pub fn psql(&self, sql: &str) -> Result<String> {
        let mut cmd = as_postgres(&self.bin, "psql");
        cmd.args(["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.socket_dir)
            .args([
                "-p",
                &self.port.unwrap_or(5432).to_string(),
                "-c",
                sql,
                "postgres",
            ]);
        let out = cmd.output().context("running psql")?;
        if !out.status.success() {
            bail!(
                "psql failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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

    /// pgbench's own figures from its last report: `tps` and `latency_ms` (its average).
    pub fn metrics(&self) -> BTreeMap<String, f64> {
        let text = fs::read_to_string(self.report()).unwrap_or_default();
        report_metrics(&text)
    }
}

/// pgbench's average transaction latency, ms: the other half of its result.
pub const LATENCY_MS: &str = "latency_ms";

/// The figures a pgbench report states (`tps = 2371.8 (without initial connection time)`,
/// `latency average = 4.213 ms`).
fn report_metrics(text: &str) -> BTreeMap<String, f64> {
    let value = |prefix: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
    };
    [(TPS.key, "tps = "), (LATENCY_MS, "latency average = ")]
        .into_iter()
        .filter_map(|(name, prefix)| Some((name.to_string(), value(prefix)?)))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reports_figures_are_read() {
        let text = "number of failed transactions: 0 (0.000%)\nlatency average = 4.213 ms\n\
                    initial connection time = 12.071 ms\ntps = 2371.802 (without initial connection time)\n";
        let m = report_metrics(text);
        assert_eq!(m[TPS.key], 2371.802);
        assert_eq!(m[LATENCY_MS], 4.213);
        assert!(report_metrics("").is_empty());
    }
}
