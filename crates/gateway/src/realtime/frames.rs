//! WebSocket frames (RFC 6455 §5.2) as a byte stream passes: where each frame's head ends and
//! which bytes are its payload, however the stream was cut. Heads are read by `tungstenite`'s own
//! parser; nothing here holds more than a head.

use std::io::Cursor;

use tungstenite::protocol::frame::FrameHeader;
pub(crate) use tungstenite::protocol::frame::coding::{Data, OpCode};

/// The longest frame head: 2 bytes, 8 of length, 4 of mask.
const MAX_HEAD: usize = 14;

/// A frame's head, as the relay needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Frame {
    pub(crate) opcode: OpCode,
    pub(crate) fin: bool,
    pub(crate) len: u64,
}

/// One step of a stream, in order.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Piece<'a> {
    /// A frame's whole head, and its bytes as they came.
    Head(Frame, &'a [u8]),
    /// Payload bytes as they came (masked, from a client), and `plain`, the same unmasked.
    Payload { raw: &'a [u8], plain: &'a [u8] },
    /// The frame's payload is over.
    End(Frame),
}

/// A stream that is not WebSocket frames.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct NotFrames;

/// Where a stream stands.
#[derive(Debug, Default)]
pub(crate) struct Frames {
    head: Vec<u8>,
    /// The frame whose payload is being read, with what is left of it, its mask, and how far into
    /// the mask it is.
    payload: Option<(Frame, u64, Option<[u8; 4]>, usize)>,
    plain: Vec<u8>,
}

impl Frames {
    /// Reads `input` on from where the stream stood, telling `each` every piece.
    pub(crate) fn feed(
        &mut self,
        mut input: &[u8],
        mut each: impl FnMut(Piece<'_>),
    ) -> Result<(), NotFrames> {
        loop {
            if let Some((frame, left, mask, at)) = self.payload.as_mut() {
                let n = usize::try_from(*left).unwrap_or(usize::MAX).min(input.len());
                let (raw, rest) = input.split_at(n);
                if !raw.is_empty() {
                    let plain: &[u8] = match mask {
                        Some(mask) => {
                            self.plain.clear();
                            self.plain.extend(raw.iter().enumerate().map(|(i, b)| b ^ mask[(*at + i) % 4]));
                            &self.plain
                        }
                        None => raw,
                    };
                    each(Piece::Payload { raw, plain });
                }
                *left -= n as u64;
                *at += n;
                input = rest;
                if *left > 0 {
                    return Ok(());
                }
                let frame = *frame;
                self.payload = None;
                each(Piece::End(frame));
            }
            if input.is_empty() {
                return Ok(());
            }
            // The head so far and as much of the input as a head can take, parsed together.
            let taken = (MAX_HEAD - self.head.len()).min(input.len());
            let mut window = [0u8; MAX_HEAD];
            window[..self.head.len()].copy_from_slice(&self.head);
            window[self.head.len()..self.head.len() + taken].copy_from_slice(&input[..taken]);
            let mut cursor = Cursor::new(&window[..self.head.len() + taken]);
            match FrameHeader::parse(&mut cursor).map_err(|_| NotFrames)? {
                None => {
                    self.head.extend_from_slice(&input[..taken]);
                    return Ok(());
                }
                Some((header, len)) => {
                    let head_len = usize::try_from(cursor.position()).map_err(|_| NotFrames)?;
                    let from_input = head_len - self.head.len();
                    let frame = Frame { opcode: header.opcode, fin: header.is_final, len };
                    each(Piece::Head(frame, &window[..head_len]));
                    self.head.clear();
                    input = &input[from_input..];
                    self.payload = Some((frame, len, header.mask, 0));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tungstenite::protocol::frame::Frame as Wire;
    use tungstenite::protocol::frame::coding::Control;

    /// Frames as a client (masked) or a server (not) writes them.
    fn frames(masked: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let mut text = |payload: &[u8], fin: bool, opcode: OpCode| {
            let mut frame = match opcode {
                OpCode::Control(Control::Ping) => Wire::ping(payload.to_vec()),
                _ => Wire::message(payload.to_vec(), opcode, fin),
            };
            if masked {
                frame.header_mut().mask = Some([1, 2, 3, 4]);
            }
            frame.format(&mut out).expect("formats");
        };
        text(br#"{"type":"response.create"}"#, true, OpCode::Data(Data::Text));
        text(&vec![b'a'; 300], false, OpCode::Data(Data::Text));
        text(b"ping", true, OpCode::Control(Control::Ping));
        text(&vec![b'b'; 70_000], true, OpCode::Data(Data::Continue));
        text(b"", true, OpCode::Data(Data::Binary));
        out
    }

    /// A frame as read: its opcode, fin, and its payload unmasked.
    type Read = (OpCode, bool, Vec<u8>);

    /// What a stream reads as: each frame, and every byte told, as it came.
    fn read(stream: &[u8], cuts: &[usize]) -> (Vec<Read>, Vec<u8>) {
        let mut frames = Frames::default();
        let mut read = Vec::new();
        let mut raw_again = Vec::new();
        let mut current = Vec::new();
        let mut at = 0;
        for &cut in cuts.iter().chain(std::iter::once(&stream.len())) {
            let cut = cut.clamp(at, stream.len());
            frames
                .feed(&stream[at..cut], |piece| match piece {
                    Piece::Head(_, head) => raw_again.extend_from_slice(head),
                    Piece::Payload { raw, plain } => {
                        raw_again.extend_from_slice(raw);
                        current.extend_from_slice(plain);
                    }
                    Piece::End(frame) => read.push((frame.opcode, frame.fin, std::mem::take(&mut current))),
                })
                .expect("frames");
            at = cut;
        }
        (read, raw_again)
    }

    #[test]
    fn every_frame_is_told_with_its_payload_unmasked() {
        for masked in [false, true] {
            let stream = frames(masked);
            let (read, raw) = read(&stream, &[]);
            assert_eq!(raw, stream, "every byte is told once, as it came");
            let kinds: Vec<(OpCode, bool, usize)> =
                read.iter().map(|(op, fin, p)| (*op, *fin, p.len())).collect();
            assert_eq!(
                kinds,
                [
                    (OpCode::Data(Data::Text), true, 26),
                    (OpCode::Data(Data::Text), false, 300),
                    (OpCode::Control(Control::Ping), true, 4),
                    (OpCode::Data(Data::Continue), true, 70_000),
                    (OpCode::Data(Data::Binary), true, 0),
                ]
            );
            assert_eq!(read[0].2, br#"{"type":"response.create"}"#);
        }
    }

    #[test]
    fn what_is_not_a_frame_is_refused() {
        // Opcode 0x3 with the reserved bits of an extension nobody negotiated.
        assert_eq!(Frames::default().feed(&[0xF3, 0x00], |_| {}), Err(NotFrames));
    }

    proptest! {
        /// However the stream is cut, it reads the same.
        #[test]
        fn cuts_change_nothing(masked in any::<bool>(), mut cuts in proptest::collection::vec(0usize..71_000, 0..12)) {
            cuts.sort_unstable();
            let stream = frames(masked);
            prop_assert_eq!(read(&stream, &cuts), read(&stream, &[]));
        }
    }
}
