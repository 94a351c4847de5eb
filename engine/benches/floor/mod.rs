//! The floors the whole-system benches compare against, measured in the same run: a bare Rust
//! host driving a minimal length-prefixed `exec(compile(code))` loop in Python over one pair
//! of pipes ([`round_trips`]), and a bare Rust client sending JSON lines to a minimal Python
//! server of one Unix socket that runs them ([`socket_round_trips`]: one hop, where a daemon
//! in front of a worker makes two). Nothing any design can cost less here. Also the count
//! of thread switches of a process ([`thread_switches`]), which says how many hand-overs
//! between threads a round trip costs (the floors': one in each process).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sched::{sched_setaffinity, CpuSet};
use nix::unistd::Pid;

/// The loop: read a frame, `exec(compile(code))`, reply. Nothing else.
const FLOOR_LOOP: &str = r#"
import os, struct
ns = {}
while True:
    header = os.read(0, 4)
    if not header:
        break
    code = os.read(0, struct.unpack('>I', header)[0])
    exec(compile(code, '<x>', 'exec'), ns)
    os.write(1, b'\x00\x00\x00\x02ok')
"#;

/// A server of one Unix socket connection: read a JSON line, run its code, answer a line.
#[allow(
    dead_code,
    reason = "the daemon bench's floor; the session bench has no socket"
)]
const SOCKET_LOOP: &str = r#"
import json, os, socket, sys
server = socket.socket(socket.AF_UNIX)
server.bind(sys.argv[1])
server.listen(1)
print('ready', flush=True)
connection, _ = server.accept()
lines = connection.makefile('rb')
ns = {}
for line in lines:
    request = json.loads(line)
    exec(compile(request['code'], '<x>', 'exec'), ns)
    connection.sendall(b'{"id":%d,"status":"ok"}\n' % request['id'])
"#;

/// Pins process (or thread) `pid` to CPU `cpu`.
pub fn pin(pid: u32, cpu: usize) {
    let mut set = CpuSet::new();
    set.set(cpu).expect("cpu index in range");
    sched_setaffinity(Pid::from_raw(pid as i32), &set).expect("pin to cpu");
}

/// `n` round trips of `x = 1` through the floor loop run by `python` (pinned to `cpu` when
/// given), after `n / 10` to warm up.
pub fn round_trips(python: &Path, n: usize, cpu: Option<usize>) -> Vec<Duration> {
    let mut child = Command::new(python)
        .args(["-I", "-u", "-c", FLOOR_LOOP])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python starts");
    if let Some(cpu) = cpu {
        pin(child.id(), cpu);
    }
    let mut to = child.stdin.take().expect("piped stdin");
    let mut from = child.stdout.take().expect("piped stdout");
    let code = b"x = 1";
    let mut frame = (code.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(code);
    let mut reply = [0u8; 6];
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let start = Instant::now();
        to.write_all(&frame).expect("write to the loop");
        from.read_exact(&mut reply).expect("read the loop's reply");
        if i >= n / 10 {
            samples.push(start.elapsed());
        }
    }
    drop(to);
    child.wait().expect("the loop ends");
    samples
}

/// `n` round trips of `x = 1` from a client through one Unix socket to the bare server in
/// `dir` run by `python`, after `n / 10` to warm up.
#[allow(
    dead_code,
    reason = "the daemon bench's floor; the session bench has no socket"
)]
pub fn socket_round_trips(python: &Path, dir: &Path, n: usize) -> Vec<Duration> {
    let path = dir.join("floor.sock");
    let mut child = Command::new(python)
        .args(["-I", "-u", "-c", SOCKET_LOOP])
        .arg(&path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python starts");
    let mut ready = String::new();
    BufReader::new(child.stdout.take().expect("piped stdout"))
        .read_line(&mut ready)
        .expect("the server says it is ready");
    let stream = UnixStream::connect(&path).expect("connect to the floor server");
    let mut to = stream.try_clone().expect("clone the stream");
    let mut from = BufReader::new(stream);
    let mut reply = String::new();
    let mut samples = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        let line = format!("{{\"id\":{i},\"code\":\"x = 1\"}}\n");
        let start = Instant::now();
        to.write_all(line.as_bytes()).expect("write to the server");
        reply.clear();
        from.read_line(&mut reply).expect("read the server's reply");
        if i >= n / 10 {
            samples.push(start.elapsed());
        }
    }
    drop((to, from));
    child.wait().expect("the server ends");
    samples
}

/// Context switches (voluntary and not) of every thread of process `pid` so far: each is a
/// thread going to sleep or being put off its CPU, so their count per round trip says how
/// many hand-overs between threads one costs, whatever the machine's speed or load.
pub fn thread_switches(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .flat_map(|status| {
            status
                .lines()
                .filter(|line| line.contains("ctxt_switches:"))
                .filter_map(|line| line.split_whitespace().last()?.parse::<u64>().ok())
                .collect::<Vec<_>>()
        })
        .sum()
}
