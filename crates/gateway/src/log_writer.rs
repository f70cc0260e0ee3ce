//! The process's log sink: each line goes through a bounded queue to a thread that writes it to
//! stderr, so that a slow stderr (a full pipe, a stalled collector) never makes a request wait, and
//! a flood of lines is dropped and counted (`recovea_log_lines_dropped_total`) rather than queued
//! without end.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::Duration;

/// Lines the process's log dropped because its queue was full.
static LINES_DROPPED: AtomicU64 = AtomicU64::new(0);

/// How many lines the process's log queue holds: about 4 MiB of access log, a few seconds of a
/// flood at full speed, before lines are dropped.
pub const DEFAULT_LOG_QUEUE_LINES: usize = 16 * 1024;

/// How long [`LogFlusher`] waits for the queue to be written out when the process ends.
const FLUSH_WAIT: Duration = Duration::from_secs(2);

/// Lines the process's log dropped so far (see [`bounded_stderr`]).
pub fn log_lines_dropped() -> u64 {
    LINES_DROPPED.load(Relaxed)
}

enum Message {
    Line(Vec<u8>),
    /// Write out everything queued before this, then answer.
    Flush(SyncSender<()>),
}

/// Hands each write (the log subscriber writes one whole line at a time) to the writing thread,
/// never waiting: when the queue is full the line is dropped and counted.
#[derive(Clone)]
pub struct LogWriter {
    queue: SyncSender<Message>,
    dropped: &'static AtomicU64,
}

impl Write for LogWriter {
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        match self.queue.try_send(Message::Line(line.to_vec())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Relaxed);
            }
            // The writing thread is gone (it could not start, or the process is ending): write here.
            Err(TrySendError::Disconnected(_)) => {
                let _ = io::stderr().write_all(line);
            }
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes out what is queued when dropped (at the end of `main`), waiting a moment at most.
pub struct LogFlusher {
    queue: SyncSender<Message>,
}

impl Drop for LogFlusher {
    fn drop(&mut self) {
        let (done, written) = mpsc::sync_channel(1);
        if self.queue.send(Message::Flush(done)).is_ok() {
            let _ = written.recv_timeout(FLUSH_WAIT);
        }
    }
}

/// The process's log: stderr behind a queue of `capacity` lines, its drops counted in
/// [`log_lines_dropped`].
pub fn bounded_stderr(capacity: usize) -> io::Result<(LogWriter, LogFlusher)> {
    bounded(io::stderr(), capacity, &LINES_DROPPED)
}

/// `out` behind a queue of `capacity` lines, written by a thread of its own.
pub fn bounded(
    out: impl Write + Send + 'static,
    capacity: usize,
    dropped: &'static AtomicU64,
) -> io::Result<(LogWriter, LogFlusher)> {
    let (queue, lines) = mpsc::sync_channel(capacity);
    std::thread::Builder::new().name("recovea-log".into()).spawn(move || write_lines(out, &lines))?;
    Ok((LogWriter { queue: queue.clone(), dropped }, LogFlusher { queue }))
}

/// How long the writing thread lets lines gather after a batch of more than one: under load, a
/// line then costs its producer a push onto the queue, never the wake-up of this thread; alone, a
/// line is written at once (a process killed right after it still has it in its log).
const BATCH_WINDOW: Duration = Duration::from_millis(2);

/// Writes what is queued through one buffer, flushes, and, when lines came faster than one at a
/// time, waits [`BATCH_WINDOW`] before looking again.
fn write_lines(out: impl Write, lines: &Receiver<Message>) {
    let mut out = io::BufWriter::with_capacity(64 << 10, out);
    while let Ok(first) = lines.recv() {
        write(first, &mut out);
        let mut more = false;
        while let Ok(next) = lines.try_recv() {
            write(next, &mut out);
            more = true;
        }
        let _ = out.flush();
        if more {
            std::thread::sleep(BATCH_WINDOW);
        }
    }
    let _ = out.flush();
}

fn write(message: Message, out: &mut impl Write) {
    match message {
        Message::Line(line) => {
            let _ = out.write_all(&line);
        }
        Message::Flush(done) => {
            let _ = out.flush();
            let _ = done.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A sink that takes nothing until it is opened, then keeps what it is given; it tells when
    /// a write first waits at it.
    #[derive(Clone, Default)]
    struct Gate {
        state: Arc<(Mutex<(bool, bool)>, std::sync::Condvar)>,
        written: Arc<Mutex<Vec<u8>>>,
    }

    impl Gate {
        fn open(&self) {
            self.state.0.lock().expect("gate").0 = true;
            self.state.1.notify_all();
        }

        fn wait_until_entered(&self) {
            let mut state = self.state.0.lock().expect("gate");
            while !state.1 {
                state = self.state.1.wait(state).expect("gate");
            }
        }
    }

    impl Write for Gate {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            let mut state = self.state.0.lock().expect("gate");
            state.1 = true;
            self.state.1.notify_all();
            while !state.0 {
                state = self.state.1.wait(state).expect("gate");
            }
            self.written.lock().expect("written").extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stalled_sink_drops_and_counts_lines_instead_of_blocking_the_writer() {
        static DROPPED: AtomicU64 = AtomicU64::new(0);
        let gate = Gate::default();
        let (mut log, flusher) = bounded(gate.clone(), 4, &DROPPED).expect("log thread");
        log.write_all(b"line 0\n").expect("never fails");
        gate.wait_until_entered();
        // The thread is stuck in the sink: every write still returns at once; past the queue's
        // four lines, lines are dropped.
        for i in 1..100 {
            log.write_all(format!("line {i}\n").as_bytes()).expect("never fails");
        }
        assert_eq!(DROPPED.load(Relaxed), 95);
        gate.open();
        drop(flusher);
        let written = String::from_utf8(gate.written.lock().expect("written").clone()).expect("utf-8");
        assert_eq!(written, "line 0\nline 1\nline 2\nline 3\nline 4\n");
    }

    #[test]
    fn the_flusher_writes_out_every_queued_line() {
        static DROPPED: AtomicU64 = AtomicU64::new(0);
        let gate = Gate::default();
        gate.open();
        let (mut log, flusher) = bounded(gate.clone(), 1024, &DROPPED).expect("log thread");
        for i in 0..500 {
            log.write_all(format!("{i}\n").as_bytes()).expect("never fails");
        }
        drop(flusher);
        assert_eq!(DROPPED.load(Relaxed), 0);
        let written = gate.written.lock().expect("written").clone();
        let expected: String = (0..500).map(|i| format!("{i}\n")).collect();
        assert_eq!(String::from_utf8(written).expect("utf-8"), expected);
    }
}
