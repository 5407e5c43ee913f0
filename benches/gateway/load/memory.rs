//! Resident memory of a subject: its process and every process under it (a Python server may
//! fork), read from `/proc` (proc(5): `VmRSS` in `/proc/PID/status`, the parent in field 4 of
//! `/proc/PID/stat`).

use std::fs;
use std::time::Duration;

use tokio::sync::watch;

/// The resident memory of `pid` and its descendants, in KiB (0 when none can be read).
pub fn resident_kib(pid: u32) -> u64 {
    tree(pid).into_iter().map(vm_rss).sum()
}

/// Samples [`resident_kib`] every `every` until `stop` says so; the largest sample.
pub async fn peak_kib(pid: u32, every: Duration, mut stop: watch::Receiver<bool>) -> u64 {
    let mut peak = resident_kib(pid);
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => peak = peak.max(resident_kib(pid)),
            _ = stop.changed() => return peak.max(resident_kib(pid)),
        }
    }
}

/// Whether `pid` runs (a process that ended but was not waited for yet is a zombie, state `Z`).
pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after_command = &stat[stat.rfind(')')? + 1..];
            after_command
                .split_whitespace()
                .next()
                .map(|state| state != "Z")
        })
        .unwrap_or(false)
}

/// `pid` and the processes under it.
fn tree(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|child| {
            let stat = fs::read_to_string(format!("/proc/{child}/stat")).ok()?;
            Some((child, parent_in(&stat)?))
        })
        .collect();
    let mut found = vec![pid];
    let mut next = 0;
    while next < found.len() {
        let parent = found[next];
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        next += 1;
    }
    found
}

/// The parent's id in a `/proc/PID/stat` line: the second field after the command, which is in
/// parentheses and may itself hold spaces and parentheses.
fn parent_in(stat: &str) -> Option<u32> {
    let after_command = &stat[stat.rfind(')')? + 1..];
    after_command.split_whitespace().nth(1)?.parse().ok()
}

fn vm_rss(pid: u32) -> u64 {
    let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
        return 0;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_follows_the_command_whatever_it_holds() {
        assert_eq!(parent_in("42 (python3) S 7 42 42 0"), Some(7));
        assert_eq!(parent_in("42 (a) b (c) R 9 1"), Some(9));
        assert_eq!(parent_in("garbage"), None);
    }

    #[test]
    fn this_process_is_alive_and_a_process_that_never_was_is_not() {
        assert!(alive(std::process::id()));
        assert!(!alive(u32::MAX));
    }

    #[test]
    fn this_process_has_resident_memory() {
        assert!(resident_kib(std::process::id()) > 100);
    }
}
