//! Transparent huge pages for the index's memory.
//!
//! A KV index lookup is a chain of dependent reads across an arena of 100 MB or more (at
//! 16-token blocks), and on 4 KiB pages nearly every step is a TLB miss as well as a cache
//! miss. glibc's malloc backs its large allocations with transparent huge pages when asked
//! (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`: it advises them `MADV_HUGEPAGE`, which the
//! kernel honours in its default `madvise` mode), but reads the setting only when a process
//! starts. So the commands that hold an index (`serve`, `frontend`, `sim`) start again, once,
//! as the same process (`exec`, same PID) with it set. Measured in docs/benchmarks.md.
//!
//! Nothing happens when `GLIBC_TUNABLES` already says anything of `glibc.malloc.hugetlb`
//! (`glibc.malloc.hugetlb=0` turns this off), when the kernel has huge pages off, or off
//! Linux with glibc.

/// The tunable this sets.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TUNABLE: &str = "glibc.malloc.hugetlb";

/// Starts this process again with glibc's malloc using transparent huge pages, when it does
/// not yet and may; returns (doing nothing) otherwise, or when `exec` fails.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn enable() {
    use std::os::unix::process::CommandExt;

    let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
    if tunables.contains(TUNABLE) {
        return;
    }
    let mode = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled");
    if !mode.is_ok_and(|m| !m.contains("[never]")) {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let value = if tunables.is_empty() {
        format!("{TUNABLE}=1")
    } else {
        format!("{tunables}:{TUNABLE}=1")
    };
    let mut args = std::env::args_os();
    let mut command = std::process::Command::new(exe);
    if let Some(arg0) = args.next() {
        command.arg0(arg0);
    }
    let error = command.args(args).env("GLIBC_TUNABLES", value).exec();
    // Only reached when exec failed: go on as we are.
    eprintln!("note: could not restart with transparent huge pages ({error}); going on without");
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn enable() {}
