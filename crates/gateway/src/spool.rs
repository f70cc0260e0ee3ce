//! The receipt spool: receipts appended to local segment files as each response ends, then shipped
//! in batches to a [`ReceiptSink`] and forgotten only once delivered.
//!
//! A receipt is appended (a `write` to the page cache, no `fsync`) before the last frame of its
//! response is released, so a process killed at any moment (SIGKILL included) has on disk the receipt
//! of every response that completed. The receipts a connection thread finishes in one turn of its
//! runtime share one `write` ([`group`]). That append is the only metering work a response waits
//! for: a few microseconds of local I/O, never the ledger, the network or an `fsync`, which a
//! background thread does every 200 ms for the sake of power loss. How far delivery has got is
//! recorded in a file of the spool about once a second (and at shutdown), so a restart replays
//! whatever was not recorded as delivered; the sink's inserts are idempotent by receipt id, so a
//! batch delivered twice is counted once. The last few batches' worth of appended receipts are
//! also kept in memory, each with the place of its line, so that the shipper need not read back and
//! parse what it was just handed: it takes them from memory when delivery stands exactly at their
//! lines, and reads the files otherwise.
//!
//! A disk that refuses an append (full, or failing) costs no receipt that memory can hold: the
//! receipt is held in memory, within a bound in receipts and bytes ([`MemoryBound`]), delivered
//! from there once the files are delivered, and appended as soon as the disk takes it again. A
//! failed append leaves its segment as it was (cut back to its last whole line) and opens no file.
//! Only past the bound is a receipt dropped, counted and logged. Once delivery has reached the end
//! of the segment being appended to, the next record of progress starts a new one, so the delivered
//! one is deleted: the spool holds little more than what is undelivered.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, IoSlice, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use recovea_core::receipt::{DeliveryError, Receipt, ReceiptSink, SerializedReceipt};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::throttled::Throttled;

mod appender;
mod group;
mod segments;
use appender::Appender;
pub use group::Written;
use segments::{Batch, Progress, count_unshipped, next_batch, segment_path, segments, text_bytes};

/// A new segment starts past this size, so that delivered ones can be deleted whole.
const SEGMENT_BYTES: u64 = 8 << 20;
/// How long a woken shipper waits for more receipts before it delivers: one batch, rather than one
/// ledger transaction per receipt under load.
const COALESCE: Duration = Duration::from_millis(25);
/// How many receipts one delivery carries at most, and how many bytes of their text: far below what
/// a control plane takes in one request (64 MiB), whatever the receipts hold.
const BATCH: usize = 512;
const BATCH_BYTES: usize = 4 << 20;
/// Where receipts the sink refused as invalid are set aside, one line each, never sent again.
pub const DEAD_LETTER_FILE: &str = "dead-letter";
/// How much receipt text appended lately is kept in memory for the shipper: about 12,000 receipts,
/// half a second's at 24,000 a second. Under steady load delivery trails appends by up to a few
/// thousand receipts (a batch on its way, the pause that gathers the next); past this bound (a sink
/// down, a backlog) the shipper reads them back from the files and parses them again, which cost
/// a node about 2% of its CPU when the bound was 2,048 receipts.
const MIRRORED_BYTES: usize = 8 << 20;
/// How often written data is forced to disk (a SIGKILL loses nothing written; this is for power loss).
const SYNC_EVERY: Duration = Duration::from_millis(200);
const SHIPPED_FILE: &str = "shipped";
/// How often the shipped file records delivery's progress while receipts flow. Recording it (a
/// file written, synced and renamed) after every batch took an eighth of the shipper's time; after
/// a crash, a restart delivers again what came after the last record, and delivery is idempotent.
const RECORD_EVERY: Duration = Duration::from_secs(1);

/// How many receipts the disk refused may wait in memory, unless [`Spool::open_bounded`] says
/// otherwise: about a minute of a busy node's receipts.
pub const DEFAULT_MEMORY_BOUND: MemoryBound = MemoryBound { receipts: 100_000, bytes: 64 << 20 };

/// The most receipts, and the most bytes of their text, that wait in memory while the disk refuses
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBound {
    pub receipts: usize,
    pub bytes: usize,
}

/// Counters the node reports.
#[derive(Debug, Default)]
pub struct SpoolStats {
    /// Written to the spool (or held in memory) and not yet delivered.
    pub pending: AtomicI64,
    pub delivered: AtomicU64,
    /// Lost: refused by the disk while memory held as many as its bound allows.
    pub dropped: AtomicU64,
    /// Lines of a segment that could not be read back (a write torn by a crash).
    pub corrupt: AtomicU64,
    /// Refused by the disk and waiting in memory.
    pub held: AtomicU64,
    /// The size of the spool's segment files.
    pub bytes: AtomicU64,
    /// Writes that appended receipts: the receipts that end together on a thread share one.
    pub writes: AtomicU64,
    /// Receipts read back from the files for delivery: memory no longer held them, delivery having
    /// fallen behind by more than it keeps (a sink down or slow, a restart).
    pub read_back: AtomicU64,
    /// Receipts the sink refused as invalid, set aside in [`DEAD_LETTER_FILE`].
    pub dead_lettered: AtomicU64,
}

/// What the spool keeps of a receipt in memory for its shipper, as its sink reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keeps {
    /// The receipt and its text: the ledger in `serve` stores the receipt's fields.
    Receipts,
    /// The text alone: a node ships text to the control plane, so the receipt's fields are freed
    /// on the connection thread that made them rather than on the shipper's.
    Text,
}

/// The request side of the spool: appends receipts.
#[derive(Clone)]
pub struct SpoolSender {
    appender: Arc<Appender>,
    stats: Arc<SpoolStats>,
    written: Arc<Notify>,
    keeps: Keeps,
}

impl SpoolSender {
    /// Appends a finished request's receipt, or holds it in memory when the disk refuses it. Never
    /// costs the response; past the memory bound it costs the receipt, counted and logged.
    pub fn send(&self, receipt: Receipt) {
        self.append(vec![self.serialized(receipt)]);
    }

    /// As [`Self::send`], but the line is written together with those of the other receipts this
    /// thread finishes in the same turn of its runtime: one `write` for all of them rather than one
    /// each. The receipt is on disk once the returned [`Written`] is ready.
    pub fn send_grouped(&self, receipt: Receipt) -> Written {
        group::queue(self, self.serialized(receipt))
    }

    fn serialized(&self, receipt: Receipt) -> SerializedReceipt {
        match self.keeps {
            Keeps::Receipts => SerializedReceipt::new(receipt),
            Keeps::Text => SerializedReceipt::text_of(&receipt),
        }
    }

    /// Appends the receipts' lines (or holds them in memory) and tells the shipper.
    fn append(&self, receipts: Vec<SerializedReceipt>) {
        let kept = self.appender.append(receipts);
        if kept > 0 {
            self.stats.pending.fetch_add(kept as i64, Relaxed);
            self.written.notify_one();
        }
    }
}

/// A spool directory, appended to by requests and synced by a background thread.
pub struct Spool {
    pub sender: SpoolSender,
    pub stats: Arc<SpoolStats>,
    dir: PathBuf,
    written: Arc<Notify>,
    shipped: Mutex<Shipped>,
}

/// How far delivery has got, and how far the shipped file says it has.
struct Shipped {
    progress: Progress,
    recorded: Progress,
    recorded_at: Instant,
}

impl Spool {
    /// Opens (or creates) the spool in `dir` and appends to a new segment, so that a segment torn
    /// by a crash is never appended to. Holds at most [`DEFAULT_MEMORY_BOUND`] in memory.
    pub fn open(dir: &Path) -> io::Result<Self> {
        Self::open_bounded(dir, DEFAULT_MEMORY_BOUND, Keeps::Receipts)
    }

    /// As [`Self::open`], holding at most `bound` in memory while the disk refuses receipts, and
    /// keeping of each receipt what its sink reads.
    pub fn open_bounded(dir: &Path, bound: MemoryBound, keeps: Keeps) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let next = segments(dir)?.last().map_or(1, |(n, _)| n + 1);
        let stats = Arc::new(SpoolStats::default());
        let recorded = Progress::load(dir)?;
        let unshipped = count_unshipped(dir, recorded)?;
        stats.pending.store(unshipped, Relaxed);
        let mut bytes = 0;
        for (_, path) in segments(dir)? {
            bytes += fs::metadata(path)?.len();
        }
        stats.bytes.store(bytes, Relaxed);
        let appender = Appender::open(dir, next, MIRRORED_BYTES, bound, Arc::clone(&stats))?;
        if unshipped == 0 {
            appender.lock().end_of_earlier = Some(recorded);
        }
        let appender = Arc::new(appender);
        let syncing = Arc::downgrade(&appender);
        std::thread::Builder::new().name("receipt-spool-sync".into()).spawn(move || {
            // Ends with the appender, when the last sender is gone.
            while let Some(appender) = syncing.upgrade() {
                appender.append_held();
                appender.sync();
                drop(appender);
                std::thread::sleep(SYNC_EVERY);
            }
        })?;
        let written = Arc::new(Notify::new());
        Ok(Self {
            sender: SpoolSender { appender, stats: Arc::clone(&stats), written: Arc::clone(&written), keeps },
            stats,
            dir: dir.to_owned(),
            written,
            shipped: Mutex::new(Shipped { progress: recorded, recorded, recorded_at: Instant::now() }),
        })
    }

    /// Delivers spooled receipts to `sink` until `shutdown`, then makes one last attempt.
    pub async fn ship(&self, sink: Arc<dyn ReceiptSink>, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut backoff = Duration::from_millis(100);
        loop {
            let failing = match self.ship_available(sink.as_ref()).await {
                Ok(()) => {
                    backoff = Duration::from_millis(100);
                    false
                }
                Err(e) => {
                    tracing::warn!(error = %e, "receipts not delivered yet; they stay in the spool");
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    true
                }
            };
            // While the sink fails, new receipts wait for the backoff (a down control plane is not
            // called once per request); otherwise a new receipt is shipped after a short pause that
            // lets the receipts of concurrent requests join its batch.
            tokio::select! {
                () = self.written.notified(), if !failing => {
                    tokio::select! {
                        () = tokio::time::sleep(COALESCE) => {}
                        () = &mut shutdown => break,
                    }
                }
                () = tokio::time::sleep(backoff) => {}
                () = &mut shutdown => break,
            }
        }
        if let Err(e) = self.ship_available(sink.as_ref()).await {
            tracing::warn!(error = %e, "receipts left in the spool at shutdown; they are delivered on the next start");
        }
        self.record_logged().await;
    }

    fn shipped(&self) -> std::sync::MutexGuard<'_, Shipped> {
        self.shipped.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the shipped file should catch up now: a second after it was written, or at once
    /// when delivery has passed a segment (which can then be deleted).
    fn record_due(&self) -> bool {
        let shipped = self.shipped();
        shipped.progress != shipped.recorded
            && (shipped.progress.segment != shipped.recorded.segment
                || shipped.recorded_at.elapsed() >= RECORD_EVERY)
    }

    /// Writes delivery's progress to the shipped file (if it moved) and deletes the segments it
    /// has passed. When delivery has reached the end of the segment being appended to, a new one
    /// starts first, so that this one is deleted too.
    async fn record(&self) -> Result<(), String> {
        let progress = {
            let shipped = self.shipped();
            if shipped.progress == shipped.recorded {
                return Ok(());
            }
            shipped.progress
        };
        let progress = match self.sender.appender.roll_if_delivered(progress) {
            Some(rolled) => {
                self.shipped().progress = rolled;
                rolled
            }
            None => progress,
        };
        let (dir, stats) = (self.dir.clone(), Arc::clone(&self.stats));
        tokio::task::spawn_blocking(move || progress.commit(&dir, &stats))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let mut shipped = self.shipped();
        shipped.recorded = progress;
        shipped.recorded_at = Instant::now();
        Ok(())
    }

    async fn record_logged(&self) {
        if let Err(e) = self.record().await {
            tracing::warn!(error = %e, "the spool's progress was not recorded; a restart delivers some receipts again");
        }
    }

    /// Forces every receipt appended so far to disk: at shutdown, after the servers have drained.
    pub async fn sync(&self) {
        let appender = Arc::clone(&self.sender.appender);
        let _ = tokio::task::spawn_blocking(move || appender.sync()).await;
    }

    /// Delivers everything written so far, batch by batch, recording progress when it is due.
    /// Returns once a batch reaches the end of what was written.
    /// At start-up, before serving, this brings the ledger up to date.
    pub async fn ship_available(&self, sink: &dyn ReceiptSink) -> Result<(), String> {
        let mut more = true;
        loop {
            // Also when there is nothing to deliver, so that an idle shipper's periodic call
            // records the last delivery. Failing to record is not failing to deliver: it costs at
            // most a second delivery after a restart.
            if self.record_due() {
                self.record_logged().await;
            }
            if !more {
                return Ok(());
            }
            let (dir, appender) = (self.dir.clone(), Arc::clone(&self.sender.appender));
            let start = self.shipped().progress;
            let batch = tokio::task::spawn_blocking(move || next_batch(&dir, &appender, start))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
            let Some(Batch { receipts, progress, corrupt, held, read_back }) = batch else { return Ok(()) };
            let delivered = receipts.len();
            let full = delivered == BATCH || text_bytes(&receipts) >= BATCH_BYTES;
            // Receipts from memory exist nowhere else: a failed delivery gives them back.
            let kept = (held > 0).then(|| receipts[delivered - held..].to_vec());
            if !receipts.is_empty()
                && let Err(e) = self.deliver_or_set_aside(sink, receipts).await
            {
                if let Some(kept) = kept {
                    self.sender.appender.give_back_held(kept);
                }
                return Err(e.to_string());
            }
            self.shipped().progress = progress;
            self.stats.corrupt.fetch_add(corrupt, Relaxed);
            self.stats.read_back.fetch_add(read_back as u64, Relaxed);
            self.stats.delivered.fetch_add(delivered as u64, Relaxed);
            self.stats.pending.fetch_sub(delivered as i64, Relaxed);
            // A short batch reached the end of what was written: receipts written meanwhile wait
            // for the shipper's pause, so that under steady load each delivery carries the pause's
            // worth rather than the few written during the last delivery.
            more = full;
        }
    }

    /// Delivers `batch`. A batch the sink refuses as invalid is delivered again a receipt at a
    /// time, and a receipt refused alone is set aside in the dead-letter file: one bad receipt
    /// (a tenant's, or a bug's) never holds up the others. `Err` only for a sink that failed.
    async fn deliver_or_set_aside(
        &self,
        sink: &dyn ReceiptSink,
        batch: Vec<SerializedReceipt>,
    ) -> Result<(), DeliveryError> {
        let (why, batch) = match sink.deliver(batch).await {
            Err(DeliveryError::Refused { why, batch }) => (why, batch),
            other => return other,
        };
        if let [receipt] = &batch[..] {
            self.set_aside(receipt, &why);
            return Ok(());
        }
        for receipt in batch {
            match sink.deliver(vec![receipt]).await {
                Err(DeliveryError::Refused { why, batch }) => {
                    batch.iter().for_each(|r| self.set_aside(r, &why))
                }
                other => other?,
            }
        }
        Ok(())
    }

    /// Appends a refused receipt to the dead-letter file, counted and logged: an operator reads it
    /// there (a receipt's JSON per line) and may deliver it again once its fault is known.
    fn set_aside(&self, receipt: &SerializedReceipt, why: &str) {
        let path = self.dir.join(DEAD_LETTER_FILE);
        let written = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut file| file.write_all(format!("{}\n", receipt.json()).as_bytes()));
        self.stats.dead_lettered.fetch_add(1, Relaxed);
        // Its id (ours, read back from its text: this path is rare), never its client-supplied fields.
        let id = &receipt.receipt().id;
        match written {
            Ok(()) => tracing::error!(
                error = %why,
                file = %path.display(),
                receipt_id = %id,
                "a receipt refused as invalid was set aside in the spool's dead-letter file; the others go on"
            ),
            Err(e) => tracing::error!(
                error = %why,
                write_error = %e,
                receipt_id = %id,
                "a receipt refused as invalid could not be set aside and is lost; the others go on"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use recovea_core::money::Nanos;
    use recovea_core::receipt::DeliveryError;

    use super::segments::read_batch;
    use super::*;

    /// A directory of the test's own, removed after it (also for `group`'s tests).
    pub(super) struct TempDir(pub(super) PathBuf);

    impl TempDir {
        pub(super) fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!("recovea-spool-{name}-{}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            Self(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A sink that can be told to fail, recording what it accepted and how often it was called.
    #[derive(Default)]
    struct Sink {
        accepted: StdMutex<Vec<Receipt>>,
        failing: std::sync::atomic::AtomicBool,
        calls: std::sync::atomic::AtomicUsize,
    }

    impl ReceiptSink for Sink {
        fn deliver(
            &self,
            batch: Vec<SerializedReceipt>,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), DeliveryError>> + Send + '_>>
        {
            self.calls.fetch_add(1, Relaxed);
            let result = if self.failing.load(Relaxed) {
                Err(DeliveryError::Failed("ledger down".into()))
            } else {
                self.accepted
                    .lock()
                    .expect("lock")
                    .extend(batch.into_iter().map(SerializedReceipt::into_receipt));
                Ok(())
            };
            Box::pin(async move { result })
        }
    }

    fn receipt(n: usize) -> Receipt {
        Receipt { cost_usd: Nanos(n as i64), ..Receipt::example(&format!("rcpt_{n}")) }
    }

    /// A ledger that refuses, as invalid, any batch holding a receipt of the model `poison`, as a
    /// control plane refuses a batch it cannot parse or take; what it accepted, and the size of
    /// each batch it was sent.
    #[derive(Default)]
    struct Picky {
        accepted: StdMutex<Vec<String>>,
        batches: StdMutex<Vec<(usize, usize)>>,
    }

    impl ReceiptSink for Picky {
        fn deliver(
            &self,
            batch: Vec<SerializedReceipt>,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), DeliveryError>> + Send + '_>>
        {
            self.batches.lock().expect("lock").push((batch.len(), text_bytes(&batch)));
            let result = if batch.iter().any(|r| r.json().contains(r#""model":"poison""#)) {
                Err(DeliveryError::Refused { why: "400: receipts[1]: invalid".into(), batch })
            } else {
                let ids = batch.into_iter().map(|r| r.into_receipt().id);
                self.accepted.lock().expect("lock").extend(ids);
                Ok(())
            };
            Box::pin(async move { result })
        }
    }

    /// One tenant's receipt the ledger refuses (here, a model it will not take) is set aside in the
    /// dead-letter file, counted; every other receipt, before it and after it, is delivered, and
    /// nothing waits behind it.
    #[tokio::test]
    async fn a_receipt_the_ledger_refuses_is_set_aside_and_every_other_one_delivered() {
        let dir = TempDir::new("poison");
        let spool = Spool::open(&dir.0).expect("open");
        for n in 0..20 {
            let model = if n == 7 { "poison" } else { "gpt-4o" };
            spool.sender.send(Receipt { model: Some(model.into()), ..receipt(n) });
        }
        let sink = Picky::default();
        spool.ship_available(&sink).await.expect("delivered, the poison set aside");
        let accepted = sink.accepted.lock().expect("lock").clone();
        let expected: Vec<String> = (0..20).filter(|n| *n != 7).map(|n| format!("rcpt_{n}")).collect();
        assert_eq!(accepted, expected, "every other receipt, in order");
        assert_eq!(spool.stats.dead_lettered.load(Relaxed), 1);
        let set_aside = fs::read_to_string(dir.0.join(DEAD_LETTER_FILE)).expect("the dead-letter file");
        assert_eq!(set_aside.lines().count(), 1);
        assert!(set_aside.contains(r#""id":"rcpt_7""#), "{set_aside}");

        // Later receipts go straight through: the poison is never sent again.
        spool.sender.send(receipt(20));
        let before = sink.batches.lock().expect("lock").len();
        spool.ship_available(&sink).await.expect("delivered");
        assert_eq!(
            sink.batches.lock().expect("lock")[before..],
            [(1, text_bytes(&[SerializedReceipt::new(receipt(20))]))]
        );
        assert_eq!(sink.accepted.lock().expect("lock").last().map(String::as_str), Some("rcpt_20"));
    }

    /// However large a tenant made its receipts, a delivery carries about `BATCH_BYTES` of them.
    #[tokio::test]
    async fn a_batch_is_bounded_in_bytes_as_well_as_in_receipts() {
        let dir = TempDir::new("batch-bytes");
        let spool = Spool::open(&dir.0).expect("open");
        let big = "m".repeat(1 << 20);
        for n in 0..12 {
            spool.sender.send(Receipt { model: Some(big.clone()), ..receipt(n) });
        }
        let sink = Picky::default();
        spool.ship_available(&sink).await.expect("delivered");
        let batches = sink.batches.lock().expect("lock").clone();
        assert_eq!(batches.iter().map(|(n, _)| n).sum::<usize>(), 12);
        assert!(batches.len() >= 3, "{batches:?}");
        for (_, bytes) in &batches {
            assert!(
                *bytes < BATCH_BYTES + (1 << 20) + 4096,
                "one receipt past the bound at most: {batches:?}"
            );
        }
    }

    /// Runs the shipper into `sink` until the sender it returns is used (or dropped).
    fn ship_until_stopped(
        spool: &Arc<Spool>,
        sink: &Arc<Sink>,
    ) -> (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (spool, sink) = (Arc::clone(spool), Arc::clone(sink) as Arc<dyn ReceiptSink>);
        let shipper = tokio::spawn(async move {
            spool
                .ship(sink, async {
                    let _ = stopped.await;
                })
                .await;
        });
        (stop, shipper)
    }

    async fn ship_all(spool: &Spool, sink: &Arc<Sink>) -> Result<(), String> {
        let sink: Arc<dyn ReceiptSink> = sink.clone();
        spool.ship_available(sink.as_ref()).await
    }

    #[tokio::test]
    async fn a_dead_sink_keeps_receipts_until_it_is_back_and_a_restart_replays_them_once() {
        let dir = TempDir::new("dead-sink");
        let sink = Arc::new(Sink::default());
        {
            let spool = Spool::open(&dir.0).expect("open");
            for n in 0..1200 {
                spool.sender.send(receipt(n));
            }
            sink.failing.store(true, Relaxed);
            assert!(ship_all(&spool, &sink).await.is_err());
            assert_eq!(spool.stats.pending.load(Relaxed), 1200);
            sink.failing.store(false, Relaxed);
            // Deliver part of it, as if the process died after the first batch.
            let from = Progress::load(&dir.0).expect("progress");
            let batch = read_batch(&dir.0, from).expect("read").expect("a batch");
            let sink_dyn: Arc<dyn ReceiptSink> = sink.clone();
            sink_dyn.deliver(batch.receipts).await.expect("delivered");
            batch.progress.commit(&dir.0, &SpoolStats::default()).expect("commit");
        }
        let spool = Spool::open(&dir.0).expect("reopen");
        assert_eq!(spool.stats.pending.load(Relaxed), 1200 - BATCH as i64);
        spool.sender.send(receipt(5000));
        ship_all(&spool, &sink).await.expect("delivered");
        let accepted = sink.accepted.lock().expect("lock").clone();
        let mut ids: Vec<&str> = accepted.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids.len(), 1201, "each receipt delivered once");
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 1201);
        assert_eq!(spool.stats.pending.load(Relaxed), 0);
        assert_eq!(
            spool.stats.read_back.load(Relaxed),
            1200 - BATCH as u64 + 1,
            "after a restart, from the files"
        );
        // Delivered segments are gone; only the one being written remains.
        assert_eq!(segments(&dir.0).expect("list").len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn the_shipper_batches_a_burst_and_waits_out_a_failing_sink() {
        let dir = TempDir::new("shipper");
        let spool = Arc::new(Spool::open(&dir.0).expect("open"));
        let sink = Arc::new(Sink::default());
        let (stop, shipper) = ship_until_stopped(&spool, &sink);
        tokio::time::sleep(Duration::from_millis(10)).await;
        let idle_calls = sink.calls.load(Relaxed);
        // A burst of receipts, each waking the shipper: they go in one delivery.
        for n in 0..50 {
            spool.sender.send(receipt(n));
        }
        tokio::time::sleep(COALESCE * 2).await;
        assert_eq!(sink.accepted.lock().expect("lock").len(), 50);
        assert_eq!(sink.calls.load(Relaxed) - idle_calls, 1, "one delivery for the burst");
        assert_eq!(spool.stats.read_back.load(Relaxed), 0, "a burst the shipper keeps up with is in memory");

        // A failing sink is not called once per receipt: it waits out its backoff.
        sink.failing.store(true, Relaxed);
        let before = sink.calls.load(Relaxed);
        for n in 50..250 {
            spool.sender.send(receipt(n));
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let calls = sink.calls.load(Relaxed) - before;
        assert!(calls <= 6, "{calls} deliveries attempted in one second of failures");
        sink.failing.store(false, Relaxed);
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert_eq!(sink.accepted.lock().expect("lock").len(), 250, "all delivered once the sink is back");
        let _ = stop.send(());
        shipper.await.expect("shipper");
    }

    #[tokio::test(start_paused = true)]
    async fn the_shipped_file_catches_up_once_the_shipper_idles_and_at_shutdown() {
        let dir = TempDir::new("record");
        let spool = Arc::new(Spool::open(&dir.0).expect("open"));
        let sink = Arc::new(Sink::default());
        let (stop, shipper) = ship_until_stopped(&spool, &sink);
        let recorded = || Progress::load(&dir.0).expect("progress");
        // The first delivery moves into the first segment, which is recorded at once.
        spool.sender.send(receipt(0));
        tokio::time::sleep(COALESCE * 2).await;
        let start = recorded();
        assert_eq!(start, spool.shipped().progress);
        for n in 1..10 {
            spool.sender.send(receipt(n));
        }
        tokio::time::sleep(COALESCE * 2).await;
        assert_eq!(sink.accepted.lock().expect("lock").len(), 10);
        let delivered = spool.shipped().progress;
        assert_ne!(delivered, start);
        assert_eq!(recorded(), start, "not recorded after each batch");
        tokio::time::sleep(RECORD_EVERY * 2).await;
        assert_eq!(recorded(), spool.shipped().progress, "recorded once the shipper idles");
        let next = Progress { segment: delivered.segment + 1, offset: 0 };
        assert_eq!(recorded(), next, "past the delivered segment, which is gone");
        assert!(!segment_path(&dir.0, delivered.segment).exists());

        for n in 10..20 {
            spool.sender.send(receipt(n));
        }
        let _ = stop.send(());
        shipper.await.expect("shipper");
        assert_eq!(sink.accepted.lock().expect("lock").len(), 20, "delivered at shutdown");
        let delivered = spool.shipped().progress;
        assert_ne!(delivered, start);
        assert_eq!(recorded(), delivered, "and recorded");
        drop(spool);
        assert_eq!(Spool::open(&dir.0).expect("reopen").stats.pending.load(Relaxed), 0);
    }

    #[tokio::test]
    async fn a_torn_last_line_is_skipped_once_its_segment_is_closed() {
        let dir = TempDir::new("torn");
        {
            let spool = Spool::open(&dir.0).expect("open");
            spool.sender.send(receipt(1));
        }
        // A crash in the middle of an append leaves half a line.
        let first = segments(&dir.0).expect("list")[0].1.clone();
        OpenOptions::new()
            .append(true)
            .open(&first)
            .expect("open")
            .write_all(b"{\"id\":\"rcpt_2\",\"requ")
            .expect("write");
        let spool = Spool::open(&dir.0).expect("reopen");
        spool.sender.send(receipt(3));
        let sink = Arc::new(Sink::default());
        ship_all(&spool, &sink).await.expect("delivered");
        let ids: Vec<String> = sink.accepted.lock().expect("lock").iter().map(|r| r.id.clone()).collect();
        assert_eq!(ids, ["rcpt_1", "rcpt_3"]);
        assert_eq!(spool.stats.corrupt.load(Relaxed), 1);
    }

    #[tokio::test]
    async fn segments_roll_over_and_are_deleted_once_delivered() {
        let dir = TempDir::new("roll");
        let spool = Spool::open(&dir.0).expect("open");
        // Lines of one length, so that memory (as much text as a segment) holds them all.
        let receipt = |n| Receipt::example(&format!("rcpt_{n:06}"));
        let line_len = serde_json::to_vec(&receipt(0)).expect("json").len() as u64 + 1;
        let count = (SEGMENT_BYTES / line_len + 10) as usize;
        let sink = Arc::new(Sink::default());
        // The first line delivered from memory too: nothing was waiting in the files.
        spool.sender.send(receipt(0));
        ship_all(&spool, &sink).await.expect("delivered");
        for n in 1..count {
            spool.sender.send(receipt(n));
        }
        assert_eq!(segments(&dir.0).expect("list").len(), 2);
        ship_all(&spool, &sink).await.expect("delivered");
        assert_eq!(sink.accepted.lock().expect("lock").len(), count);
        assert_eq!(
            spool.stats.read_back.load(Relaxed),
            0,
            "delivery crossed into the new segment from memory"
        );
        assert_eq!(segments(&dir.0).expect("list").len(), 1);
    }

    #[tokio::test]
    async fn a_spool_that_keeps_text_alone_delivers_the_same_receipts() {
        let dir = TempDir::new("text");
        let spool = Spool::open_bounded(&dir.0, DEFAULT_MEMORY_BOUND, Keeps::Text).expect("open");
        spool.sender.send(receipt(1));
        spool.sender.send_grouped(receipt(2)).await;
        let sink = Arc::new(Sink::default());
        ship_all(&spool, &sink).await.expect("delivered");
        assert_eq!(*sink.accepted.lock().expect("lock"), [receipt(1), receipt(2)]);
    }

    fn ids(receipts: &[Receipt]) -> Vec<String> {
        receipts.iter().map(|r| r.id.clone()).collect()
    }

    #[test]
    fn the_shipper_takes_from_memory_only_the_lines_at_which_delivery_stands() {
        let dir = TempDir::new("mirror");
        fs::create_dir_all(&dir.0).expect("dir");
        // Where each line ends.
        let mut ends = vec![0];
        for n in 0..8 {
            ends.push(ends[n] + serde_json::to_vec(&receipt(n)).expect("json").len() as u64 + 1);
        }
        // Room for the text of three lines, their newlines aside.
        let three = (ends[3] - 3) as usize;
        let appender = Appender::open(&dir.0, 1, three, DEFAULT_MEMORY_BOUND, Arc::default()).expect("open");
        let append = |n| assert_eq!(appender.append(vec![SerializedReceipt::new(receipt(n))]), 1, "appended");
        let at = |lines: usize| Progress { segment: 1, offset: ends[lines] };
        for n in 0..3 {
            append(n);
        }
        // Memory holds all three lines appended: from any of them, the rest of them is the batch.
        assert!(appender.take_mirrored(at(1)).is_some_and(|b| b.receipts.len() == 2 && b.progress == at(3)));
        assert!(appender.take_mirrored(at(0)).is_none(), "taken lines are gone from memory");
        for n in 3..7 {
            append(n);
        }
        assert!(appender.take_mirrored(Progress { segment: 0, offset: 0 }).is_none());
        // Three lines kept and a fourth that memory had no room for: a batch of the three would
        // tell the shipper it reached the end.
        assert!(appender.take_mirrored(at(3)).is_none());
        let batch = read_batch(&dir.0, at(0)).expect("read").expect("a batch");
        assert_eq!(batch.receipts.len(), 7, "the files hold every line");
        assert_eq!(batch.read_back, 7);
        assert_eq!(batch.progress, at(7));
        // What the file read delivered is forgotten, and what memory gives is what the files say.
        assert!(appender.take_mirrored(at(7)).is_none());
        append(7);
        let from_memory = appender.take_mirrored(at(7)).expect("the last line is in memory");
        assert_eq!(from_memory.read_back, 0);
        let from_files = read_batch(&dir.0, at(7)).expect("read").expect("batch");
        assert_eq!((from_memory.receipts, from_memory.progress), (from_files.receipts, at(8)));
    }

    #[tokio::test]
    async fn receipts_missing_from_memory_are_read_from_the_files_in_order_once() {
        let dir = TempDir::new("mirror-gaps");
        let mut spool = Spool::open(&dir.0).expect("open");
        let four = 4 * serde_json::to_vec(&receipt(10)).expect("json").len();
        spool.sender.appender = Arc::new(
            Appender::open(&dir.0, 100, four, DEFAULT_MEMORY_BOUND, Arc::default()).expect("appender"),
        );
        let sink = Arc::new(Sink::default());
        let mut sent = Vec::new();
        for round in 0..3 {
            // More than memory keeps: it holds the first four, not the rest, so the batch is read
            // from the files.
            for n in 0..10 {
                let receipt = receipt(round * 10 + n);
                sent.push(receipt.id.clone());
                spool.sender.send(receipt);
            }
            ship_all(&spool, &sink).await.expect("delivered");
        }
        assert_eq!(ids(&sink.accepted.lock().expect("lock")), sent);
        assert_eq!(spool.stats.read_back.load(Relaxed), 30);
    }

    /// A tmpfs of `kib` KiB mounted at a fresh directory (the tests run as root), unmounted when
    /// dropped: a disk that fills.
    struct Tmpfs(TempDir);

    impl Tmpfs {
        fn mount(name: &str, kib: u32) -> Self {
            let dir = TempDir::new(name);
            fs::create_dir_all(&dir.0).expect("mount point");
            let status = std::process::Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={kib}k"), "tmpfs"])
                .arg(&dir.0)
                .status()
                .expect("mount runs");
            assert!(status.success(), "mounting a tmpfs needs root: these tests run as root");
            Self(dir)
        }

        /// Fills the disk with one file, which `free` deletes.
        fn fill(&self) {
            let mut filler = File::create(self.0.0.join("filler")).expect("filler");
            let block = vec![0u8; 4096];
            while filler.write_all(&block).is_ok() {}
            let _ = filler.sync_all();
        }

        fn free(&self) {
            fs::remove_file(self.0.0.join("filler")).expect("filler deleted");
        }
    }

    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0.0).status();
        }
    }

    fn files_in(dir: &Path) -> usize {
        fs::read_dir(dir).expect("listed").count()
    }

    #[tokio::test]
    async fn a_full_disk_holds_receipts_in_memory_delivers_them_from_there_and_appends_them_once_it_has_room()
    {
        let disk = Tmpfs::mount("full", 256);
        let dir = disk.0.0.join("spool");
        let spool = Spool::open_bounded(&dir, MemoryBound { receipts: 50, bytes: 1 << 20 }, Keeps::Receipts)
            .expect("open");
        disk.fill();
        let files = files_in(&dir);
        for n in 1..=60 {
            spool.sender.send(receipt(n));
        }
        assert_eq!(files_in(&dir), files, "a failed append opens no file");
        let (held, dropped) = (|| spool.stats.held.load(Relaxed), || spool.stats.dropped.load(Relaxed));
        assert_eq!((held(), dropped()), (50, 10), "memory holds its bound, past it receipts are lost");
        assert_eq!(spool.stats.pending.load(Relaxed), 50);
        assert_eq!(spool.stats.bytes.load(Relaxed), 0);

        // Delivered from memory while the disk is still full.
        let sink = Arc::new(Sink::default());
        ship_all(&spool, &sink).await.expect("delivered");
        let delivered: Vec<String> =
            sink.accepted.lock().expect("lock").iter().map(|r| r.id.clone()).collect();
        let expected: Vec<String> = (1..=50).map(|n| format!("rcpt_{n}")).collect();
        assert_eq!(delivered, expected);
        assert_eq!((held(), spool.stats.pending.load(Relaxed)), (0, 0));

        // A failed delivery gives the receipts from memory back.
        for n in 61..=65 {
            spool.sender.send(receipt(n));
        }
        sink.failing.store(true, Relaxed);
        assert!(ship_all(&spool, &sink).await.is_err());
        assert_eq!(held(), 5);

        // Room again: the held receipts are appended (as the sync thread does every 200 ms), then
        // delivered from the file, once.
        disk.free();
        spool.sender.appender.append_held();
        assert_eq!(held(), 0);
        sink.failing.store(false, Relaxed);
        ship_all(&spool, &sink).await.expect("delivered");
        let ids: Vec<String> = sink.accepted.lock().expect("lock").iter().map(|r| r.id.clone()).collect();
        let expected: Vec<String> = (1..=50).chain(61..=65).map(|n| format!("rcpt_{n}")).collect();
        assert_eq!(ids, expected);
    }

    #[tokio::test]
    async fn the_delivered_part_of_the_segment_being_appended_to_is_reclaimed_at_the_next_record() {
        let dir = TempDir::new("reclaim");
        let spool = Spool::open(&dir.0).expect("open");
        for n in 0..100 {
            spool.sender.send(receipt(n));
        }
        let written = spool.stats.bytes.load(Relaxed);
        assert!(written > 0);
        let sink = Arc::new(Sink::default());
        ship_all(&spool, &sink).await.expect("delivered");
        spool.record().await.expect("recorded");
        assert_eq!(spool.stats.bytes.load(Relaxed), 0, "the spool holds nothing delivered");
        let on_disk: u64 =
            segments(&dir.0).expect("list").iter().map(|(_, p)| fs::metadata(p).expect("meta").len()).sum();
        assert_eq!(on_disk, 0);
        // Appends go on in the new segment, and a restart delivers them and nothing before.
        spool.sender.send(receipt(100));
        drop(spool);
        let spool = Spool::open(&dir.0).expect("reopen");
        let again = Arc::new(Sink::default());
        ship_all(&spool, &again).await.expect("delivered");
        assert_eq!(ids(&again.accepted.lock().expect("lock")), vec!["rcpt_100".to_owned()]);
    }
}
