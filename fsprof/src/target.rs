//! The traced target: a command fsprof starts (held before exec until the probes follow
//! it, so not one syscall is missed), or a running process tree (`-p PID`).

use std::{
    ffi::CString,
    fs,
    io::{Read, Write},
    os::{
        fd::AsRawFd,
        unix::{ffi::OsStrExt, fs::PermissionsExt},
    },
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};

use crate::signals;

/// How the target ended and what it cost, as wait4(2) reports it (GNU time's source).
#[derive(Clone, Debug, Default)]
pub struct Exit {
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub wall: Duration,
    pub user: Duration,
    pub sys: Duration,
}

/// A child forked and stopped just before exec.
pub struct Held {
    pid: i32,
    release: fs::File,
    exec_error: fs::File,
    argv0: String,
}

fn tv(t: libc::timeval) -> Duration {
    Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000)
}

/// The file `prog` names, searched in PATH as a shell would. Done here, not by execvp in
/// the child, so the target makes exactly one execve (as under strace) and a missing
/// command is a clear error before anything starts.
pub fn resolve_program(prog: &str) -> Result<PathBuf> {
    if prog.contains('/') {
        return Ok(PathBuf::from(prog));
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
        .with_context(|| format!("cannot run {prog:?}: command not found in PATH"))
}

fn cstring(s: impl AsRef<[u8]>) -> Result<CString> {
    CString::new(s.as_ref()).context("argument contains a NUL byte")
}

/// Forks `argv`, with `cwd` as working directory; the child waits before exec until
/// `Held::run`. A plain fork/exec because std's spawn() waits for the exec, which we hold.
pub fn spawn_held(argv: &[String], cwd: Option<&Path>) -> Result<Held> {
    if argv.is_empty() {
        bail!("no command given: use `fsprof trace -- COMMAND [ARGS…]`");
    }
    // Everything the child needs is prepared before fork: after it, only
    // async-signal-safe calls.
    let exec = Exec::new(argv, cwd)?;
    let (hold_r, hold_w) = crate::os::pipe()?;
    let (err_r, err_w) = crate::os::pipe()?;
    // fsprof's signals stay blocked across the fork until the child has the default
    // handlers: one arriving in between kills the child as it would the command, instead
    // of running fsprof's handler in it.
    let old = block_signals();
    // SAFETY: the child only makes async-signal-safe calls on memory prepared before the
    // fork (no allocation, no locks) and ends in execv or _exit.
    let pid = unsafe { libc::fork() };
    if pid != 0 {
        // SAFETY: restores the mask saved above.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    }
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("fork");
    }
    if pid == 0 {
        // SAFETY: in the child, as above; the fds are open (copies of the parent's).
        unsafe {
            libc::close(hold_w.as_raw_fd());
            libc::close(err_r.as_raw_fd());
            exec.in_child(&old, hold_r.as_raw_fd(), err_w.as_raw_fd())
        }
    }
    // The parent keeps the writing end of the hold pipe and the reading end of the error
    // pipe; the other two close here.
    drop((hold_r, err_w));
    Ok(Held {
        pid,
        release: fs::File::from(hold_w),
        exec_error: fs::File::from(err_r),
        argv0: argv[0].clone(),
    })
}

/// The command's program, arguments, environment and directory as execve and chdir take
/// them (the pointer arrays point into the strings kept beside them).
struct Exec {
    program: CString,
    _args: Vec<CString>,
    arg_ptrs: Vec<*const libc::c_char>,
    _env: Vec<CString>,
    env_ptrs: Vec<*const libc::c_char>,
    dir: Option<CString>,
}

impl Exec {
    fn new(argv: &[String], cwd: Option<&Path>) -> Result<Exec> {
        let program = cstring(resolve_program(&argv[0])?.as_os_str().as_bytes())?;
        let args: Vec<CString> = argv.iter().map(cstring).collect::<Result<_>>()?;
        // PWD follows the directory, as a shell's `cd` would leave it: a shell whose PWD
        // names another directory asks getcwd(2) at start, a call the command did not make.
        let env: Vec<CString> = std::env::vars_os()
            .filter(|(k, _)| cwd.is_none() || k != "PWD")
            .map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat())
            .chain(cwd.map(|d| [b"PWD=".as_slice(), d.as_os_str().as_bytes()].concat()))
            .map(cstring)
            .collect::<Result<_>>()?;
        let ptrs = |v: &[CString]| {
            v.iter()
                .map(|a| a.as_ptr())
                .chain([std::ptr::null()])
                .collect()
        };
        Ok(Exec {
            program,
            arg_ptrs: ptrs(&args),
            _args: args,
            env_ptrs: ptrs(&env),
            _env: env,
            dir: cwd.map(|d| cstring(d.as_os_str().as_bytes())).transpose()?,
        })
    }

    /// The child's side: default signals, wait for the release on `hold_r`, chdir, exec;
    /// an errno goes to `err_w`.
    ///
    /// # Safety
    /// Only in a child just forked: async-signal-safe calls on memory prepared before.
    unsafe fn in_child(&self, old: &libc::sigset_t, hold_r: i32, err_w: i32) -> ! {
        // SAFETY: as the function's contract says.
        unsafe {
            // Default dispositions: fsprof's handlers must not leak into the command.
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            libc::sigprocmask(libc::SIG_SETMASK, old, std::ptr::null_mut());
            let mut b = 0u8;
            // The parent closing without writing means it gave up: do not run the command.
            if libc::read(hold_r, (&mut b as *mut u8).cast(), 1) != 1 {
                libc::_exit(127);
            }
            if let Some(d) = &self.dir
                && libc::chdir(d.as_ptr()) != 0
            {
                let e = *libc::__errno_location();
                libc::write(err_w, (&e as *const i32).cast(), 4);
                libc::_exit(127);
            }
            libc::execve(
                self.program.as_ptr(),
                self.arg_ptrs.as_ptr(),
                self.env_ptrs.as_ptr(),
            );
            let e = *libc::__errno_location();
            libc::write(err_w, (&e as *const i32).cast(), 4);
            libc::_exit(127)
        }
    }
}

/// Blocks fsprof's signals in this thread; the mask before.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data (zeroes valid), then set by sigemptyset/sigaddset;
    // pthread_sigmask gets pointers to these live locals.
    let (mut ours, mut old): (libc::sigset_t, libc::sigset_t) = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe {
        libc::sigemptyset(&mut ours);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut ours, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &ours, &mut old);
    }
    old
}

impl Held {
    pub fn pid(&self) -> u32 {
        self.pid as u32
    }

    /// Lets the child exec and waits for it, returning its rusage-based times.
    pub fn run(mut self) -> Result<Exit> {
        signals::set_child(self.pid);
        let start = Instant::now();
        // A SIGTERM that came before the child was known was not passed on: the command
        // never starts, and ends as one killed by it would (its handlers are the defaults).
        if signals::received() == Some(libc::SIGTERM) {
            // SAFETY: our own child, not yet reaped.
            unsafe { libc::kill(self.pid, libc::SIGTERM) };
        } else {
            self.release
                .write_all(b"g")
                .context("releasing the child")?;
        }
        drop(self.release);
        // EOF (exec closed the CLOEXEC pipe) means the command started; 4 bytes are errno.
        let mut errno = [0u8; 4];
        let exec_failed = self.exec_error.read_exact(&mut errno).is_ok();
        let mut status = 0;
        // SAFETY: rusage is plain integers, for which all zeroes is a valid value.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        loop {
            // wait4, not waitpid: the child's own rusage is GNU time's figure (rustix has
            // no wait4). SAFETY: both pointers are to live locals of the right types.
            let r = unsafe { libc::wait4(self.pid, &mut status, 0, &mut ru) };
            if r == self.pid {
                break;
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                return Err(err).context("wait4");
            }
        }
        let wall = start.elapsed();
        signals::set_child(0);
        if exec_failed {
            let e = std::io::Error::from_raw_os_error(i32::from_ne_bytes(errno));
            bail!("cannot run {:?}: {e}", self.argv0);
        }
        Ok(Exit {
            code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
            signal: libc::WIFSIGNALED(status).then(|| libc::WTERMSIG(status)),
            wall,
            user: tv(ru.ru_utime),
            sys: tv(ru.ru_stime),
        })
    }
}

/// Every thread of `pid` and of all its descendants with its state letter (R, S, D, …),
/// as /proc shows them now.
pub fn process_tree_threads(pid: u32) -> Result<Vec<(u32, char)>> {
    if !Path::new(&format!("/proc/{pid}")).exists() {
        bail!("no process with PID {pid}");
    }
    let mut children: std::collections::HashMap<u32, Vec<u32>> = Default::default();
    for entry in fs::read_dir("/proc")?.flatten() {
        let Some(p) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(ppid) = crate::os::stat_field(p, 4) {
            children.entry(ppid as u32).or_default().push(p);
        }
    }
    let mut out = Vec::new();
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        if let Ok(tasks) = fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                    continue;
                };
                let state = fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|s| s.rfind(')').and_then(|i| s[i + 2..].chars().next()))
                    .unwrap_or('?');
                out.push((tid, state));
            }
        }
        stack.extend(children.get(&p).into_iter().flatten());
    }
    Ok(out)
}

/// CPU time of a live process and its reaped children (utime+cutime, stime+cstime).
pub fn process_cpu(pid: u32) -> Option<(Duration, Duration)> {
    let tick = rustix::param::clock_ticks_per_second() as f64;
    let f = |n| crate::os::stat_field(pid, n).map(|v| v as f64 / tick);
    let user = f(14)? + f(16)?;
    let sys = f(15)? + f(17)?;
    Some((Duration::from_secs_f64(user), Duration::from_secs_f64(sys)))
}

pub fn alive(pid: u32) -> bool {
    rustix::process::Pid::from_raw(pid as i32)
        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok())
}

/// Sends `sig` to `pid`; false when it is gone (or was never there).
pub fn signal(pid: u32, sig: rustix::process::Signal) -> bool {
    rustix::process::Pid::from_raw(pid as i32)
        .is_some_and(|p| rustix::process::kill_process(p, sig).is_ok())
}
