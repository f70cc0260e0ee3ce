//! The spool on disk: its segments, how far delivery got (`Progress`), and the batches read back
//! from them for the shipper.

use super::*;

pub(super) fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("seg-{n:012}.jsonl"))
}

/// The segments in `dir`, oldest first.
pub(super) fn segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        let number = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("seg-")?.strip_suffix(".jsonl")?.parse::<u64>().ok());
        if let Some(n) = number {
            found.push((n, path));
        }
    }
    found.sort();
    Ok(found)
}

/// How far delivery has got: a segment and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Progress {
    pub(super) segment: u64,
    pub(super) offset: u64,
}

impl Progress {
    pub(super) fn load(dir: &Path) -> io::Result<Self> {
        match fs::read_to_string(dir.join(SHIPPED_FILE)) {
            Ok(text) => {
                let mut parts = text.split_whitespace().map(str::parse::<u64>);
                match (parts.next(), parts.next()) {
                    (Some(Ok(segment)), Some(Ok(offset))) => Ok(Self { segment, offset }),
                    _ => {
                        Err(io::Error::new(io::ErrorKind::InvalidData, "the spool's shipped file is corrupt"))
                    }
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Self { segment: 0, offset: 0 }),
            Err(e) => Err(e),
        }
    }

    /// Deletes the segments wholly delivered, then records progress atomically (write then
    /// rename). Deleting first frees a full disk for the record; a restart that finds an older
    /// record skips the deleted segments all the same.
    pub(super) fn commit(self, dir: &Path, stats: &SpoolStats) -> io::Result<()> {
        for (n, path) in segments(dir)? {
            if n < self.segment {
                let size = fs::metadata(&path).map_or(0, |m| m.len());
                fs::remove_file(path)?;
                stats.bytes.fetch_sub(size, Relaxed);
            }
        }
        let tmp = dir.join(format!("{SHIPPED_FILE}.tmp"));
        {
            let mut file = File::create(&tmp)?;
            writeln!(file, "{} {}", self.segment, self.offset)?;
            file.sync_all()?;
        }
        fs::rename(&tmp, dir.join(SHIPPED_FILE))
    }
}

pub(super) struct Batch {
    pub(super) receipts: Vec<SerializedReceipt>,
    /// Where delivery stands once this batch is delivered.
    pub(super) progress: Progress,
    pub(super) corrupt: u64,
    /// How many of the receipts, at the end, were held in memory (the disk refused them).
    pub(super) held: usize,
    /// How many of the receipts, at the start, were read back from the files.
    pub(super) read_back: usize,
}

/// Up to [`BATCH`] receipts from where delivery stands, from memory when they are there, else
/// from the files; once the files are all delivered, receipts the disk refused. `None`: nothing
/// to do.
pub(super) fn next_batch(dir: &Path, appender: &Appender, start: Progress) -> io::Result<Option<Batch>> {
    let mut batch = match appender.take_mirrored(start) {
        Some(batch) => Some(batch),
        None => read_batch(dir, start)?,
    };
    let progress = batch.as_ref().map_or(start, |b| b.progress);
    let room = BATCH - batch.as_ref().map_or(0, |b| b.receipts.len());
    let full = batch.as_ref().is_some_and(|b| text_bytes(&b.receipts) >= BATCH_BYTES);
    if room > 0 && !full && appender.is_at_end(progress) {
        let held = appender.take_held(room);
        if !held.is_empty() {
            let batch = batch.get_or_insert_with(|| Batch {
                receipts: Vec::new(),
                progress,
                corrupt: 0,
                held: 0,
                read_back: 0,
            });
            batch.held = held.len();
            batch.receipts.extend(held);
        }
    }
    Ok(batch)
}

/// The bytes of the receipts' text.
pub(super) fn text_bytes(receipts: &[SerializedReceipt]) -> usize {
    receipts.iter().map(|r| r.json().len()).sum()
}

/// Reads up to [`BATCH`] receipts (and about [`BATCH_BYTES`] of them) from the files, from `start`. `None`: nothing to do.
pub(super) fn read_batch(dir: &Path, start: Progress) -> io::Result<Option<Batch>> {
    let mut progress = start;
    let all = segments(dir)?;
    let newest = all.last().map(|(n, _)| *n);
    let (mut receipts, mut corrupt, mut bytes) = (Vec::new(), 0, 0);
    for (n, path) in all.iter().filter(|(n, _)| *n >= start.segment) {
        let offset = if *n == progress.segment { progress.offset } else { 0 };
        let mut reader = BufReader::new(File::open(path)?);
        reader.seek(SeekFrom::Start(offset))?;
        let mut consumed = offset;
        let mut line = Vec::new();
        let mut at_end = false;
        while receipts.len() < BATCH && bytes < BATCH_BYTES {
            line.clear();
            let read = reader.read_until(b'\n', &mut line)?;
            if read == 0 || line.last() != Some(&b'\n') {
                // The end, or a line still being written (or torn, in a segment no longer written).
                if read > 0 && Some(*n) != newest {
                    corrupt += 1;
                    consumed += read as u64;
                }
                at_end = true;
                break;
            }
            consumed += read as u64;
            let text = std::str::from_utf8(&line[..line.len() - 1]).map_err(serde::de::Error::custom);
            match text.and_then(SerializedReceipt::parse) {
                Ok(receipt) => {
                    bytes += receipt.json().len();
                    receipts.push(receipt);
                }
                Err(e) => {
                    corrupt += 1;
                    tracing::error!(error = %e, segment = n, "an unreadable line in the receipt spool was skipped");
                }
            }
        }
        if at_end && Some(*n) != newest {
            // This segment is done: move past it so that it can be deleted.
            progress.segment = n + 1;
            progress.offset = 0;
        } else {
            progress.segment = *n;
            progress.offset = consumed;
            break;
        }
    }
    if progress == start && receipts.is_empty() {
        return Ok(None);
    }
    let read_back = receipts.len();
    Ok(Some(Batch { receipts, progress, corrupt, held: 0, read_back }))
}

/// Counts the receipts written and not yet delivered, for the pending gauge at start-up.
pub(super) fn count_unshipped(dir: &Path, start: Progress) -> io::Result<i64> {
    let mut count = 0;
    for (n, path) in segments(dir)?.iter().filter(|(n, _)| *n >= start.segment) {
        let mut reader = BufReader::new(File::open(path)?);
        if *n == start.segment {
            reader.seek(SeekFrom::Start(start.offset))?;
        }
        count += reader.split(b'\n').count() as i64;
    }
    Ok(count)
}
