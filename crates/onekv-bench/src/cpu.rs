//! CPU time per operation: what the servers and the benchmark client spent, read from the kernel's
//! per-process counters around each phase, because on a small machine CPU (not the disk) is what
//! bounds throughput (issue 21), and throughput alone hides a change that costs more CPU per
//! operation.
//!
//! Owns: reading a process's user + system CPU time (`/proc/PID/stat`) and the difference between
//! two readings of a set of processes. Does not own which processes those are (the local clusters
//! know their children's pids) nor the report (`runner`).

use std::io;

/// CPU seconds of the processes a phase is measured on.
#[derive(Debug, Clone, Default)]
pub struct CpuProbe {
    /// The servers' process ids (empty when the harness did not start them: then only the
    /// client's CPU is known).
    pub server_pids: Vec<u32>,
}

/// One reading of a [`CpuProbe`].
#[derive(Debug, Clone, Copy)]
pub struct CpuReading {
    /// Sum over the servers, `None` if there are none or one could not be read (it exited).
    servers: Option<f64>,
    /// This process (the client), `None` off Linux.
    client: Option<f64>,
}

impl CpuProbe {
    /// Reads every process's CPU time now.
    pub fn read(&self) -> CpuReading {
        let servers = if self.server_pids.is_empty() {
            None
        } else {
            self.server_pids.iter().map(|&pid| cpu_seconds(&format!("/proc/{pid}/stat")).ok()).sum()
        };
        CpuReading { servers, client: cpu_seconds("/proc/self/stat").ok() }
    }
}

impl CpuReading {
    /// CPU seconds spent since `earlier`: `(servers, client)`.
    pub fn since(&self, earlier: &CpuReading) -> (Option<f64>, Option<f64>) {
        let delta = |now: Option<f64>, then: Option<f64>| Some((now? - then?).max(0.0));
        (delta(self.servers, earlier.servers), delta(self.client, earlier.client))
    }
}

/// User + system CPU seconds of the process whose `stat` file is at `path`.
fn cpu_seconds(path: &str) -> io::Result<f64> {
    let stat = std::fs::read_to_string(path)?;
    parse_cpu_seconds(&stat, clock_ticks_per_second())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, format!("no CPU times in {path}")))
}

/// Fields 14 (utime) and 15 (stime) of a `stat` line, in clock ticks, as seconds. The command name
/// (field 2) is in parentheses and may contain spaces and parentheses, so fields are counted from
/// its last `)`.
fn parse_cpu_seconds(stat: &str, ticks_per_second: u64) -> Option<f64> {
    let after_name = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // `fields[0]` is field 3 (the state).
    let ticks = |field: usize| fields.get(field - 3)?.parse::<u64>().ok();
    Some((ticks(14)? + ticks(15)?) as f64 / ticks_per_second.max(1) as f64)
}

fn clock_ticks_per_second() -> u64 {
    rustix::param::clock_ticks_per_second()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_times_are_read_after_the_command_name() {
        // A command name with a space and a parenthesis, then state, ppid, ... utime=250 stime=50.
        let line = "1234 (onekv (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 3 4 20 0 9 0 77";
        assert_eq!(parse_cpu_seconds(line, 100), Some(3.0));
        assert_eq!(parse_cpu_seconds("1234 (short) S 1", 100), None);
        assert_eq!(parse_cpu_seconds("no name here", 100), None);
    }

    #[test]
    fn this_process_spends_cpu_and_the_probe_sees_it() {
        let probe = CpuProbe { server_pids: vec![std::process::id()] };
        let before = probe.read();
        // Burn a measurable amount of CPU (well over one clock tick).
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        let (servers, client) = probe.read().since(&before);
        assert!(servers.unwrap() > 0.05, "servers {servers:?}");
        assert!(client.unwrap() > 0.05, "client {client:?}");
        let gone = CpuProbe { server_pids: vec![u32::MAX] };
        assert_eq!(gone.read().since(&gone.read()).0, None);
        assert_eq!(CpuProbe::default().read().since(&CpuProbe::default().read()).0, None);
    }
}
