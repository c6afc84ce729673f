//! Reading a large snapshot file, and gunzipping it, on a second thread while the pickle machine parses.
//!
//! Decompression is as much work as parsing: a 21 MB pickle of the layout PyTorch >= 2.5 writes gunzips in about
//! 19 ms and parses in 30 (2-core VM, BENCHMARKS.md). One after the other they add up; on two threads the import
//! takes about as long as the longer of the two. Even a raw file gains the kernel's copy of each chunk.
//!
//! [`ReadAhead`] is the [`Read`] the machine sees: a thread fills chunks from the source (the decompressor, the
//! file) and passes them over a bounded channel, [`IN_FLIGHT`] chunks ahead at most, so memory stays a few
//! chunks whatever the file's size; the parser hands each chunk back for the next fill. An I/O or gzip error
//! reaches the parser at the byte where it happened, as the source reported it. Dropping the reader stops the
//! thread: its next hand-over fails, and the drop waits for it.

use std::io::{self, Read};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;

/// Chunks filled ahead of the parser, at most.
const IN_FLIGHT: usize = 2;

/// A chunk: its buffer and how many bytes of it were read.
type Chunk = (Vec<u8>, usize);

/// The bytes of a source read on a thread of their own (see the module docs).
pub(crate) struct ReadAhead {
    /// Filled chunks, in order; `None` once dropped.
    filled: Option<Receiver<io::Result<Chunk>>>,
    /// Emptied buffers, back to the thread.
    emptied: SyncSender<Vec<u8>>,
    /// The chunk being read, and how far.
    current: Chunk,
    pos: usize,
    thread: Option<JoinHandle<()>>,
}

impl ReadAhead {
    /// Starts reading `source` in chunks of `chunk_bytes` on a new thread.
    ///
    /// # Errors
    /// When the thread cannot be started.
    pub(crate) fn spawn<R: Read + Send + 'static>(source: R, chunk_bytes: usize) -> io::Result<Self> {
        let (fill, filled) = mpsc::sync_channel(IN_FLIGHT);
        let (emptied, empties) = mpsc::sync_channel(IN_FLIGHT + 1);
        let chunk_bytes = chunk_bytes.max(1);
        let thread = std::thread::Builder::new()
            .name("snapshot read-ahead".to_owned())
            .spawn(move || fill_chunks(source, chunk_bytes, &fill, &empties))?;
        Ok(Self { filled: Some(filled), emptied, current: (Vec::new(), 0), pos: 0, thread: Some(thread) })
    }
}

/// The thread's work: fills chunks from `source` until its end, an error, or a parser that is gone.
fn fill_chunks<R: Read>(mut source: R, chunk_bytes: usize, fill: &SyncSender<io::Result<Chunk>>, empties: &Receiver<Vec<u8>>) {
    loop {
        let mut buffer = empties.try_recv().unwrap_or_else(|_| vec![0; chunk_bytes]);
        let mut len = 0;
        while len < buffer.len() {
            match source.read(&mut buffer[len..]) {
                Ok(0) => break,
                Ok(read) => len += read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) => {
                    // What was read before the error first, then the error at its byte.
                    if len > 0 && fill.send(Ok((buffer, len))).is_err() {
                        return;
                    }
                    let _gone = fill.send(Err(error));
                    return;
                }
            }
        }
        if len == 0 || fill.send(Ok((buffer, len))).is_err() {
            // The end of the source (the channel closes), or the parser is gone.
            return;
        }
    }
}

impl Read for ReadAhead {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if out.is_empty() {
            return Ok(0);
        }
        while self.pos == self.current.1 {
            let Some(filled) = &self.filled else { return Ok(0) };
            match filled.recv() {
                Ok(Ok(next)) => {
                    let (spent, _) = std::mem::replace(&mut self.current, next);
                    self.pos = 0;
                    // The thread makes a new buffer when none comes back (the first `current` is no buffer).
                    if !spent.is_empty() {
                        let _full = self.emptied.try_send(spent);
                    }
                }
                Ok(Err(error)) => return Err(error),
                // The thread is done: the end of the source.
                Err(mpsc::RecvError) => return Ok(0),
            }
        }
        let (buffer, len) = &self.current;
        let n = out.len().min(len - self.pos);
        out[..n].copy_from_slice(&buffer[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        // Closing the channel fails the thread's next hand-over; it stops there.
        self.filled = None;
        if let Some(thread) = self.thread.take() {
            let _panicked = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes, then an error, from a source that reads at most `step` bytes a call.
    struct Source {
        bytes: Vec<u8>,
        pos: usize,
        step: usize,
        fail_at: Option<usize>,
    }

    impl Read for Source {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            if self.fail_at == Some(self.pos) {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "corrupt deflate stream"));
            }
            let end = self.bytes.len().min(self.pos + self.step.min(out.len()));
            let end = self.fail_at.map_or(end, |fail| end.min(fail));
            let n = end - self.pos;
            out[..n].copy_from_slice(&self.bytes[self.pos..end]);
            self.pos = end;
            Ok(n)
        }
    }

    fn bytes(len: usize) -> Vec<u8> {
        (0..len).map(|index| (index * 7 % 251) as u8).collect()
    }

    #[test]
    fn every_byte_arrives_in_order_whatever_the_sizes() {
        // (source length, chunk bytes, source step, parser's read size)
        let cases = [(0, 8, 3, 5), (1, 8, 3, 5), (100, 7, 3, 5), (100, 7, 100, 1), (1000, 64, 13, 1000), (4096, 1, 1, 3)];
        for (len, chunk_bytes, step, read_size) in cases {
            let source = Source { bytes: bytes(len), pos: 0, step, fail_at: None };
            let mut ahead = ReadAhead::spawn(source, chunk_bytes).unwrap();
            let mut got = Vec::new();
            let mut out = vec![0; read_size];
            loop {
                let n = ahead.read(&mut out).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&out[..n]);
            }
            assert_eq!(got, bytes(len), "{len} bytes in chunks of {chunk_bytes}");
            assert_eq!(ahead.read(&mut out).unwrap(), 0, "the end stays the end");
        }
    }

    #[test]
    fn an_error_comes_after_the_bytes_before_it() {
        for (fail_at, chunk_bytes) in [(0, 16), (5, 16), (16, 16), (40, 16), (41, 1)] {
            let source = Source { bytes: bytes(100), pos: 0, step: 7, fail_at: Some(fail_at) };
            let mut ahead = ReadAhead::spawn(source, chunk_bytes).unwrap();
            let mut got = Vec::new();
            let error = io::copy(&mut ahead, &mut got).unwrap_err();
            assert_eq!(got, bytes(fail_at), "the bytes before the error at {fail_at}");
            assert_eq!(error.kind(), io::ErrorKind::InvalidData);
            assert_eq!(error.to_string(), "corrupt deflate stream");
        }
    }

    #[test]
    fn dropping_the_reader_stops_the_thread() {
        // An endless source: the thread blocks handing over its chunks until the reader goes.
        let mut ahead = ReadAhead::spawn(io::repeat(7), 4).unwrap();
        let mut out = [0; 10];
        ahead.read_exact(&mut out).unwrap();
        assert_eq!(out, [7; 10]);
        drop(ahead); // joins the thread: the test would hang if it did not stop
    }
}
