//! Each side of a session's stream as its bytes pass: the client's text messages held until
//! whole, the provider's messages that may matter read beside.

use recovea_providers::realtime::{ServerEvent, may_matter, server_event};

use super::frames::{self, Data, Frames, OpCode, Piece};

/// The most of a client's text message held before it is forwarded; a longer one is decided on
/// what was held (as a `response.create`, to be safe) and the rest passes as it comes.
const MAX_HELD: usize = 1 << 20;
/// How much of a provider's text message is read before it is known whether it may matter.
const SNIFF: usize = 64;
/// The most of a provider's message that matters kept (a `response.done` with a long transcript).
const MAX_READ: usize = 1 << 20;

/// The client's side of the stream: its text messages held until whole.
#[derive(Default)]
pub(super) struct ClientSide {
    frames: Frames,
    /// The text message being held: its frames as they came, and its text unmasked.
    held: Option<(Vec<u8>, Vec<u8>)>,
    /// The current frame's payload is held (it belongs to the held message).
    holding: bool,
    /// The current message outgrew [`MAX_HELD`]: the rest of it passes as it comes.
    passing: bool,
}

pub(super) enum ClientStep {
    Forward(Vec<u8>),
    /// A text message, as it came and unmasked; `whole` unless it outgrew what is held.
    Message {
        raw: Vec<u8>,
        text: Vec<u8>,
        whole: bool,
    },
}

impl ClientSide {
    pub(super) fn read(
        &mut self,
        bytes: &[u8],
        steps: &mut Vec<ClientStep>,
    ) -> Result<(), frames::NotFrames> {
        let Self { frames, held, holding, passing } = self;
        let forward = |steps: &mut Vec<ClientStep>, bytes: &[u8]| match steps.last_mut() {
            Some(ClientStep::Forward(last)) => last.extend_from_slice(bytes),
            _ => steps.push(ClientStep::Forward(bytes.to_vec())),
        };
        frames.feed(bytes, |piece| match piece {
            Piece::Head(frame, head) => {
                *holding = match frame.opcode {
                    OpCode::Data(Data::Text) => {
                        *passing = false;
                        *held = Some((head.to_vec(), Vec::new()));
                        true
                    }
                    OpCode::Data(Data::Continue) if held.is_some() && !*passing => {
                        if let Some((raw, _)) = held.as_mut() {
                            raw.extend_from_slice(head);
                        }
                        true
                    }
                    _ => false,
                };
                if !*holding {
                    forward(steps, head);
                }
            }
            Piece::Payload { raw, plain } => {
                if !*holding {
                    return forward(steps, raw);
                }
                if let Some((kept, text)) = held.as_mut() {
                    kept.extend_from_slice(raw);
                    text.extend_from_slice(plain);
                    if kept.len() > MAX_HELD {
                        let (raw, text) = std::mem::take(held).unwrap_or_default();
                        steps.push(ClientStep::Message { raw, text, whole: false });
                        *holding = false;
                        *passing = true;
                    }
                }
            }
            Piece::End(frame) => {
                if *holding && frame.fin {
                    let (raw, text) = std::mem::take(held).unwrap_or_default();
                    steps.push(ClientStep::Message { raw, text, whole: true });
                }
                if matches!(frame.opcode, OpCode::Data(_)) && frame.fin {
                    *passing = false;
                }
                *holding = false;
            }
        })
    }
}

/// The provider's side of the stream: its messages that may matter read beside.
#[derive(Default)]
pub(super) struct ProviderSide {
    frames: Frames,
    /// The current text message so far, while it may matter.
    reading: Option<Vec<u8>>,
}

impl ProviderSide {
    pub(super) fn read(
        &mut self,
        bytes: &[u8],
        events: &mut Vec<ServerEvent>,
    ) -> Result<(), frames::NotFrames> {
        let reading = &mut self.reading;
        let mut control = false;
        self.frames.feed(bytes, |piece| match piece {
            Piece::Head(frame, _) => {
                control = matches!(frame.opcode, OpCode::Control(_));
                match frame.opcode {
                    OpCode::Data(Data::Text) => *reading = Some(Vec::new()),
                    OpCode::Data(Data::Continue) | OpCode::Control(_) => {}
                    OpCode::Data(_) => *reading = None,
                }
            }
            Piece::Payload { plain, .. } => {
                if control {
                    return;
                }
                if let Some(message) = reading.as_mut() {
                    let before = message.len();
                    message.extend_from_slice(plain);
                    // An event that opens with a type that does not matter (an audio delta) goes
                    // by unread; any other is kept whole, wherever its type is.
                    let sniffed = before < SNIFF && message.len() >= SNIFF;
                    if (sniffed && !may_matter(&message[..SNIFF])) || message.len() > MAX_READ {
                        *reading = None;
                    }
                }
            }
            Piece::End(frame) => {
                if !control
                    && frame.fin
                    && let Some(message) = reading.take()
                {
                    events.push(server_event(&message));
                }
                control = false;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use recovea_core::usage::Usage;
    use tungstenite::protocol::frame::Frame as WireFrame;
    use tungstenite::protocol::frame::coding::Control;

    fn frame(payload: &[u8], opcode: OpCode, fin: bool, mask: Option<[u8; 4]>) -> Vec<u8> {
        let mut frame = match opcode {
            OpCode::Control(Control::Ping) => WireFrame::ping(payload.to_vec()),
            _ => WireFrame::message(payload.to_vec(), opcode, fin),
        };
        frame.header_mut().mask = mask;
        let mut out = Vec::new();
        frame.format(&mut out).expect("formats");
        out
    }

    #[test]
    fn a_clients_text_message_is_held_until_whole_and_everything_else_passes() {
        let mask = Some([9, 8, 7, 6]);
        let mut stream = frame(br#"{"type":"response.cr"#, OpCode::Data(Data::Text), false, mask);
        let ping = frame(b"p", OpCode::Control(Control::Ping), true, mask);
        stream.extend_from_slice(&ping);
        stream.extend(frame(br#"eate"}"#, OpCode::Data(Data::Continue), true, mask));
        let audio = frame(b"\x00\x01", OpCode::Data(Data::Binary), true, mask);
        stream.extend_from_slice(&audio);
        let mut side = ClientSide::default();
        let mut steps = Vec::new();
        for byte in &stream {
            side.read(std::slice::from_ref(byte), &mut steps).expect("frames");
        }
        let mut forwarded = Vec::new();
        let mut messages = Vec::new();
        for step in steps {
            match step {
                ClientStep::Forward(bytes) => forwarded.extend(bytes),
                ClientStep::Message { raw, text, whole } => {
                    assert!(whole);
                    messages.push(text);
                    forwarded.extend(raw);
                }
            }
        }
        assert_eq!(messages, [br#"{"type":"response.create"}"#.to_vec()]);
        // The ping went ahead of the message it interrupted; every byte went, once.
        assert!(forwarded.starts_with(&ping));
        assert_eq!(forwarded.len(), stream.len());
        assert!(forwarded.ends_with(&audio));
    }

    #[test]
    fn a_providers_events_that_matter_are_read_and_the_rest_only_passes() {
        let mut stream = frame(
            br#"{"type":"response.done","response":{"usage":{"input_tokens":3,"output_tokens":4}}}"#,
            OpCode::Data(Data::Text),
            true,
            None,
        );
        let delta = format!(r#"{{"type":"response.output_audio.delta","delta":"{}"}}"#, "A".repeat(10_000));
        stream.extend(frame(delta.as_bytes(), OpCode::Data(Data::Text), true, None));
        stream.extend(frame(
            br#"{"type":"session.updated","session":{"model":"gpt-realtime"}}"#,
            OpCode::Data(Data::Text),
            true,
            None,
        ));
        let mut side = ProviderSide::default();
        let mut events = Vec::new();
        for chunk in stream.chunks(7) {
            side.read(chunk, &mut events).expect("frames");
        }
        let usage = Usage { input_tokens: 3, output_tokens: 4, ..Usage::default() };
        assert_eq!(
            events,
            [
                ServerEvent::ResponseDone { usage: Some(usage) },
                ServerEvent::Session { model: Some("gpt-realtime".into()), auto_responses: false },
            ]
        );
    }
}
