//! Keeps `onekv bench-log` from rotting: a short run of the real binary must succeed, print a
//! table row for the asked size with a positive log throughput, leave no files behind, and reject
//! nonsense flags with a clear message.

use std::process::Command;

fn onekv() -> Command {
    Command::new(env!("CARGO_BIN_EXE_onekv"))
}

#[test]
fn short_run_prints_a_row_per_cell_with_positive_throughput() {
    let dir = tempfile::tempdir().expect("temporary directory");
    let output = onekv()
        .args(["bench-log", "--seconds", "0.2", "--sizes", "128", "--appenders", "1,2", "--dir"])
        .arg(dir.path())
        .output()
        .expect("running onekv");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "onekv bench-log failed\nstdout:\n{stdout}\nstderr:\n{stderr}");

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
fn nonsense_flags_are_rejected_clearly() {
    for (flag, value, says) in
        [("--seconds", "0", "seconds"), ("--appenders", "0", "appenders"), ("--sizes", "1GiB", "outside")]
    {
        let output = onekv().args(["bench-log", flag, value]).output().expect("running onekv");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flag} {value} was accepted");
        assert!(stderr.contains(says), "{flag} {value}: unclear error:\n{stderr}");
    }
}
