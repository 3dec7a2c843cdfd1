//! Syscall numbers → names (for this machine's architecture) and the VFS operation each
//! belongs to.

use syscalls::Sysno;

pub fn name(nr: u32) -> String {
    Sysno::new(nr as usize)
        .map(|s| s.name().to_string())
        .unwrap_or_else(|| format!("syscall_{nr}"))
}

pub fn number(name: &str) -> Option<u32> {
    name.parse::<Sysno>().ok().map(|s| s.id() as u32)
}

/// The VFS operation a syscall performs, "other" when it is not a filesystem call.
pub fn op_of(name: &str) -> &'static str {
    match name {
        "open" | "openat" | "openat2" | "creat" | "open_by_handle_at" => "open",
        "read" | "pread64" | "readv" | "preadv" | "preadv2" => "read",
        "write" | "pwrite64" | "writev" | "pwritev" | "pwritev2" => "write",
        "close" | "close_range" => "close",
        "unlink" | "unlinkat" => "unlink",
        "mkdir" | "mkdirat" => "mkdir",
        "rmdir" => "rmdir",
        "rename" | "renameat" | "renameat2" => "rename",
        "stat" | "lstat" | "fstat" | "newfstatat" | "statx" | "access" | "faccessat"
        | "faccessat2" | "readlink" | "readlinkat" | "statfs" | "fstatfs" => "stat",
        "getdents" | "getdents64" => "readdir",
        "fsync" | "fdatasync" | "sync_file_range" | "syncfs" | "sync" | "msync" => "sync",
        "fallocate" => "fallocate",
        "truncate" | "ftruncate" => "truncate",
        "copy_file_range" | "sendfile" | "splice" => "copy",
        "link" | "linkat" | "symlink" | "symlinkat" => "link",
        "utime" | "utimes" | "utimensat" | "futimesat" | "chmod" | "fchmod" | "fchmodat"
        | "fchmodat2" | "chown" | "fchown" | "lchown" | "fchownat" => "setattr",
        "setxattr" | "lsetxattr" | "fsetxattr" | "getxattr" | "lgetxattr" | "fgetxattr"
        | "listxattr" | "llistxattr" | "flistxattr" | "removexattr" | "lremovexattr"
        | "fremovexattr" => "xattr",
        "lseek" | "fadvise64" | "readahead" | "fcntl" | "flock" | "ioctl" => "file",
        "mount" | "umount2" | "mknod" | "mknodat" => "namespace",
        _ => "other",
    }
}

/// Whether a positive return value counts bytes moved.
pub fn moves_bytes(name: &str) -> bool {
    matches!(op_of(name), "read" | "write" | "copy")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for n in [
            "openat",
            "unlinkat",
            "newfstatat",
            "getdents64",
            "write",
            "fsync",
        ] {
            assert_eq!(name(number(n).unwrap()), n);
            assert_ne!(op_of(n), "other");
        }
        assert!(moves_bytes("pread64") && !moves_bytes("openat"));
    }
}
