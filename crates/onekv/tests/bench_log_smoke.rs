//! Keeps `onekv bench-log` from rotting: a short run of the real binary must succeed, print a
//! table row for the asked size with a positive log throughput, leave no files behind, and reject
//! nonsense flags with a clear message.

use std::process::Command;

fn onekv() -> Command {
    Command::new(env!("CARGO_BIN_EXE_onekv"))
}

/// Runs `onekv bench-log ARGS --dir DIR`, which must succeed; returns what it printed.
fn bench_log(args: &[&str], dir: &std::path::Path) -> String {
    let output = onekv().arg("bench-log").args(args).arg("--dir").arg(dir).output().expect("running onekv");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "onekv bench-log failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    stdout
}

#[test]
fn short_run_prints_a_row_per_cell_with_positive_throughput() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let stdout = bench_log(&["--seconds", "0.2", "--sizes", "128", "--appenders", "1,2"], dir.path());

    let header: Vec<&str> = stdout
        .lines()
        .find(|l| l.starts_with("| size |"))
        .expect("a table header")
        .split('|')
        .map(str::trim)
        .collect();
    let mb_col = header.iter().position(|c| *c == "log MB/s").expect("a log MB/s column");
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .take_while(|l| !l.starts_with("Log internals"))
        .filter(|l| l.starts_with("| 128 B |"))
        .map(|l| l.split('|').map(str::trim).collect())
        .collect();
    assert_eq!(rows.len(), 2, "one row per appender count in:\n{stdout}");
    for row in rows {
        let mb: f64 = row[mb_col].parse().expect("MB/s is a number");
        assert!(mb > 0.0, "log MB/s must be positive in:\n{stdout}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).expect("listing --dir").collect();
    assert!(left.is_empty(), "bench-log left files behind: {left:?}");
}

#[test]
fn recycled_runs_print_their_table() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let args =
        ["--seconds", "0.2", "--sizes", "1KiB", "--appenders", "2", "--recycled", "--segment-mib", "1"];
    let stdout = bench_log(&args, dir.path());
    let row: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("| size | appenders | growing records/s"))
        .find(|l| l.starts_with("| 1 KiB | 2 |"))
        .expect("a row of the recycled table")
        .split('|')
        .map(str::trim)
        .collect();
    for column in [3, 4] {
        let rate: f64 = row[column].parse().expect("records/s is a number");
        assert!(rate > 0.0, "records/s must be positive in:\n{stdout}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path()).expect("listing --dir").collect();
    assert!(left.is_empty(), "bench-log left files behind: {left:?}");
}

#[test]
fn nonsense_flags_are_rejected_clearly() {
    for (flag, value, says) in
        [("--seconds", "0", "seconds"), ("--appenders", "0", "appenders"), ("--sizes", "1GiB", "outside")]
    {
        let output = onekv().args(["bench-log", flag, value]).output().expect("running onekv");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flag} {value} was accepted");
        assert!(stderr.contains(says), "{flag} {value}: unclear error:\n{stderr}");
    }
    let output =
        onekv().args(["bench-log", "--sizes", "2MiB", "--segment-mib", "1"]).output().expect("running");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success() && stderr.contains("does not fit a segment"), "{stderr}");
}
