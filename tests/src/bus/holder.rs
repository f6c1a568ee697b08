//! A minimal D-Bus peer that owns a name and answers every method call with an empty
//! reply, so that bus policy can be tested without the real service (no D-Bus crate: the
//! wire format below covers what the bus driver and `busctl` send).

use std::{
    io::{self, Read, Write},
    os::unix::net::UnixStream,
    sync::{Arc, Mutex, PoisonError},
    thread::{self, JoinHandle},
};

use super::{PrivateBus, START_TIMEOUT, effective_uid};

/// Message types and flags (D-Bus specification, "Message Format").
const METHOD_CALL: u8 = 1;
const METHOD_RETURN: u8 = 2;
const ERROR: u8 = 3;
const NO_REPLY_EXPECTED: u8 = 0x1;
/// Header field codes.
const FIELD_PATH: u8 = 1;
const FIELD_INTERFACE: u8 = 2;
const FIELD_MEMBER: u8 = 3;
const FIELD_ERROR_NAME: u8 = 4;
const FIELD_REPLY_SERIAL: u8 = 5;
const FIELD_DESTINATION: u8 = 6;
const FIELD_SENDER: u8 = 7;
const FIELD_SIGNATURE: u8 = 8;
/// The specification's maximum message size.
const MAX_MESSAGE: usize = 1 << 27;
/// `RequestName` flag and reply.
const DO_NOT_QUEUE: u32 = 4;
const PRIMARY_OWNER: u32 = 1;
const DRIVER: &str = "org.freedesktop.DBus";
const DRIVER_PATH: &str = "/org/freedesktop/DBus";

/// A method call the holder received (and answered).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The caller's unique name.
    pub sender: String,
    pub path: String,
    pub interface: Option<String>,
    pub member: String,
}

/// Owns a well-known name on a [`PrivateBus`], connected as this process's UID, and
/// replies to every method call with an empty method return. Disconnects on drop.
pub struct NameHolder {
    stream: UnixStream,
    thread: Option<JoinHandle<()>>,
    calls: Arc<Mutex<Vec<Call>>>,
    unique_name: String,
}

impl NameHolder {
    /// Connects, says Hello and requests `name` (without queueing).
    ///
    /// # Errors
    /// When the bus refuses the connection or the name (e.g. `AccessDenied` by policy),
    /// or someone else owns it.
    pub fn acquire(bus: &PrivateBus, name: &str) -> io::Result<Self> {
        let mut stream = UnixStream::connect(&bus.socket)?;
        stream.set_read_timeout(Some(START_TIMEOUT))?;
        authenticate(&mut stream)?;
        let hello = call_driver(&mut stream, 1, "Hello", "", &[])?;
        let unique_name = Reader::new(&hello.body, hello.big_endian).string()?;
        let mut body = Vec::new();
        put_string(&mut body, name)?;
        pad(&mut body, 4);
        body.extend_from_slice(&DO_NOT_QUEUE.to_le_bytes());
        let reply = call_driver(&mut stream, 2, "RequestName", "su", &body)?;
        let code = Reader::new(&reply.body, reply.big_endian).u32()?;
        if code != PRIMARY_OWNER {
            return Err(io::Error::other(format!(
                "RequestName({name}) answered {code}, not primary owner"
            )));
        }
        stream.set_read_timeout(None)?;
        let calls = Arc::new(Mutex::new(Vec::new()));
        let reader = stream.try_clone()?;
        let writer = stream.try_clone()?;
        let log = Arc::clone(&calls);
        let thread = thread::spawn(move || serve(reader, writer, &log));
        Ok(Self {
            stream,
            thread: Some(thread),
            calls,
            unique_name,
        })
    }

    /// The holder's unique connection name (`:1.N`).
    pub fn unique_name(&self) -> &str {
        &self.unique_name
    }

    /// The method calls received so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for NameHolder {
    fn drop(&mut self) {
        // Ends the serving thread's blocking read.
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Records and answers method calls until the connection ends.
fn serve(mut reader: UnixStream, mut writer: UnixStream, calls: &Mutex<Vec<Call>>) {
    let mut serial: u32 = 2;
    while let Ok(msg) = read_message(&mut reader) {
        if msg.kind != METHOD_CALL {
            continue;
        }
        let Some(sender) = msg.sender else { continue };
        calls
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Call {
                sender: sender.clone(),
                path: msg.path.unwrap_or_default(),
                interface: msg.interface,
                member: msg.member.unwrap_or_default(),
            });
        if msg.flags & NO_REPLY_EXPECTED != 0 {
            continue;
        }
        serial = serial.wrapping_add(1).max(1);
        let fields = [
            (FIELD_REPLY_SERIAL, Value::U32(msg.serial)),
            (FIELD_DESTINATION, Value::Str('s', &sender)),
        ];
        let sent = encode(METHOD_RETURN, serial, &fields, &[]).and_then(|m| writer.write_all(&m));
        if sent.is_err() {
            break;
        }
    }
}

/// SASL EXTERNAL with this process's UID, then BEGIN.
fn authenticate(stream: &mut UnixStream) -> io::Result<()> {
    let uid = effective_uid()?.to_string();
    let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
    stream.write_all(format!("\0AUTH EXTERNAL {hex}\r\n").as_bytes())?;
    // Byte by byte: nothing past the line may be consumed.
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        stream.read_exact(&mut byte)?;
        line.push(byte[0]);
        if line.len() > 512 {
            return Err(io::Error::other("authentication reply too long"));
        }
    }
    if !line.starts_with(b"OK ") {
        let reply = String::from_utf8_lossy(&line);
        return Err(io::Error::other(format!(
            "authentication refused: {}",
            reply.trim()
        )));
    }
    stream.write_all(b"BEGIN\r\n")
}

/// Calls a bus driver method and waits for its reply, skipping other messages.
fn call_driver(
    stream: &mut UnixStream,
    serial: u32,
    member: &str,
    signature: &str,
    body: &[u8],
) -> io::Result<Message> {
    let mut fields = vec![
        (FIELD_PATH, Value::Str('o', DRIVER_PATH)),
        (FIELD_INTERFACE, Value::Str('s', DRIVER)),
        (FIELD_MEMBER, Value::Str('s', member)),
        (FIELD_DESTINATION, Value::Str('s', DRIVER)),
    ];
    if !signature.is_empty() {
        fields.push((FIELD_SIGNATURE, Value::Signature(signature)));
    }
    stream.write_all(&encode(METHOD_CALL, serial, &fields, body)?)?;
    loop {
        let msg = read_message(stream)?;
        if msg.reply_serial != Some(serial) {
            continue;
        }
        return match msg.kind {
            METHOD_RETURN => Ok(msg),
            ERROR => {
                let text = Reader::new(&msg.body, msg.big_endian)
                    .string()
                    .unwrap_or_default();
                let name = msg.error_name.unwrap_or_default();
                let kind = if name.ends_with(".AccessDenied") {
                    io::ErrorKind::PermissionDenied
                } else {
                    io::ErrorKind::Other
                };
                Err(io::Error::new(kind, format!("{member}: {name}: {text}")))
            }
            other => Err(io::Error::other(format!("{member}: reply of type {other}"))),
        };
    }
}

/// A header field value.
enum Value<'a> {
    /// A string (`'s'`) or object path (`'o'`).
    Str(char, &'a str),
    Signature(&'a str),
    U32(u32),
}

/// A little-endian message with `fields` and `body`.
fn encode(kind: u8, serial: u32, fields: &[(u8, Value<'_>)], body: &[u8]) -> io::Result<Vec<u8>> {
    let mut m = vec![b'l', kind, 0, 1];
    m.extend_from_slice(&len_u32(body.len())?.to_le_bytes());
    m.extend_from_slice(&serial.to_le_bytes());
    m.extend_from_slice(&[0; 4]); // header field array length, patched below
    for (code, value) in fields {
        pad(&mut m, 8);
        m.push(*code);
        match value {
            Value::Str(sig, text) => {
                let sig = u8::try_from(*sig).map_err(|_| io::Error::other("signature char"))?;
                m.extend_from_slice(&[1, sig, 0]);
                pad(&mut m, 4);
                put_string(&mut m, text)?;
            }
            Value::Signature(sig) => {
                m.extend_from_slice(&[1, b'g', 0]);
                put_signature(&mut m, sig)?;
            }
            Value::U32(v) => {
                m.extend_from_slice(&[1, b'u', 0]);
                pad(&mut m, 4);
                m.extend_from_slice(&v.to_le_bytes());
            }
        }
    }
    let fields_len = len_u32(m.len() - 16)?;
    m[12..16].copy_from_slice(&fields_len.to_le_bytes());
    pad(&mut m, 8);
    m.extend_from_slice(body);
    Ok(m)
}

fn len_u32(len: usize) -> io::Result<u32> {
    u32::try_from(len).map_err(|_| io::Error::other("D-Bus length over 4 GiB"))
}

fn pad(buf: &mut Vec<u8>, align: usize) {
    buf.resize(buf.len().next_multiple_of(align), 0);
}

/// A string or object path: u32 length, bytes, NUL (the caller aligns to 4).
fn put_string(buf: &mut Vec<u8>, text: &str) -> io::Result<()> {
    buf.extend_from_slice(&len_u32(text.len())?.to_le_bytes());
    buf.extend_from_slice(text.as_bytes());
    buf.push(0);
    Ok(())
}

/// A signature: u8 length, bytes, NUL.
fn put_signature(buf: &mut Vec<u8>, sig: &str) -> io::Result<()> {
    let len = u8::try_from(sig.len()).map_err(|_| io::Error::other("signature too long"))?;
    buf.push(len);
    buf.extend_from_slice(sig.as_bytes());
    buf.push(0);
    Ok(())
}

/// The parts of a received message the holder uses.
#[derive(Debug, Default)]
struct Message {
    kind: u8,
    flags: u8,
    serial: u32,
    big_endian: bool,
    path: Option<String>,
    interface: Option<String>,
    member: Option<String>,
    error_name: Option<String>,
    reply_serial: Option<u32>,
    sender: Option<String>,
    body: Vec<u8>,
}

/// Reads one whole message.
fn read_message(stream: &mut impl Read) -> io::Result<Message> {
    let mut buf = vec![0u8; 16];
    stream.read_exact(&mut buf)?;
    let big_endian = match buf[0] {
        b'l' => false,
        b'B' => true,
        other => return Err(io::Error::other(format!("bad endianness byte {other}"))),
    };
    let mut fixed = Reader::new(&buf, big_endian);
    fixed.pos = 4;
    let body_len = fixed.u32()? as usize;
    let serial = fixed.u32()?;
    let fields_end = 16 + fixed.u32()? as usize;
    let header_end = fields_end.next_multiple_of(8);
    if header_end + body_len > MAX_MESSAGE {
        return Err(io::Error::other("message over the D-Bus size limit"));
    }
    buf.resize(header_end + body_len, 0);
    stream.read_exact(&mut buf[16..])?;
    let mut msg = Message {
        kind: buf[1],
        flags: buf[2],
        serial,
        big_endian,
        body: buf[header_end..].to_vec(),
        ..Message::default()
    };
    let mut r = Reader::new(&buf[..fields_end], big_endian);
    r.pos = 16;
    while r.pos < fields_end {
        r.align(8);
        let code = r.byte()?;
        match (code, r.signature()?.as_str()) {
            (_, "s" | "o") => {
                let text = r.string()?;
                match code {
                    FIELD_PATH => msg.path = Some(text),
                    FIELD_INTERFACE => msg.interface = Some(text),
                    FIELD_MEMBER => msg.member = Some(text),
                    FIELD_ERROR_NAME => msg.error_name = Some(text),
                    FIELD_SENDER => msg.sender = Some(text),
                    _ => {}
                }
            }
            (FIELD_REPLY_SERIAL, "u") => msg.reply_serial = Some(r.u32()?),
            (_, "u") => {
                r.u32()?;
            }
            (_, "g") => {
                r.signature()?;
            }
            (_, sig) => return Err(io::Error::other(format!("header field type {sig}"))),
        }
    }
    Ok(msg)
}

/// Reads D-Bus values at absolute offsets (alignment counts from the message start).
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    big_endian: bool,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], big_endian: bool) -> Self {
        Self {
            buf,
            pos: 0,
            big_endian,
        }
    }

    fn align(&mut self, align: usize) {
        self.pos = self.pos.next_multiple_of(align);
    }

    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        let bytes = self
            .buf
            .get(self.pos..self.pos + n)
            .ok_or_else(|| io::Error::other("truncated D-Bus message"))?;
        self.pos += n;
        Ok(bytes)
    }

    fn byte(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> io::Result<u32> {
        self.align(4);
        let mut raw = [0u8; 4];
        raw.copy_from_slice(self.take(4)?);
        Ok(if self.big_endian {
            u32::from_be_bytes(raw)
        } else {
            u32::from_le_bytes(raw)
        })
    }

    fn text(&mut self, len: usize) -> io::Result<String> {
        let bytes = self.take(len + 1)?;
        String::from_utf8(bytes[..len].to_vec()).map_err(|_| io::Error::other("non-UTF-8 text"))
    }

    fn string(&mut self) -> io::Result<String> {
        let len = self.u32()? as usize;
        self.text(len)
    }

    fn signature(&mut self) -> io::Result<String> {
        let len = usize::from(self.byte()?);
        self.text(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_method_call_survives_encode_and_read() {
        let mut body = Vec::new();
        put_string(&mut body, "io.hami.AmdGpu1").unwrap();
        pad(&mut body, 4);
        body.extend_from_slice(&7u32.to_le_bytes());
        let fields = [
            (FIELD_PATH, Value::Str('o', "/io/hami/AmdGpu1")),
            (FIELD_INTERFACE, Value::Str('s', "io.hami.AmdGpu1.Node")),
            (FIELD_MEMBER, Value::Str('s', "Rescan")),
            (FIELD_SENDER, Value::Str('s', ":1.42")),
            (FIELD_SIGNATURE, Value::Signature("su")),
            (FIELD_REPLY_SERIAL, Value::U32(9)),
        ];
        let bytes = encode(METHOD_CALL, 5, &fields, &body).unwrap();
        assert_eq!(bytes.len() % 8, body.len() % 8);
        let msg = read_message(&mut bytes.as_slice()).unwrap();
        assert_eq!(
            (msg.kind, msg.serial, msg.reply_serial),
            (METHOD_CALL, 5, Some(9))
        );
        assert_eq!(msg.path.as_deref(), Some("/io/hami/AmdGpu1"));
        assert_eq!(msg.interface.as_deref(), Some("io.hami.AmdGpu1.Node"));
        assert_eq!(msg.member.as_deref(), Some("Rescan"));
        assert_eq!(msg.sender.as_deref(), Some(":1.42"));
        let mut r = Reader::new(&msg.body, false);
        assert_eq!(r.string().unwrap(), "io.hami.AmdGpu1");
        assert_eq!(r.u32().unwrap(), 7);
    }

    #[test]
    fn a_big_endian_header_is_read() {
        // METHOD_RETURN, serial 3, one field: REPLY_SERIAL = 2, empty body.
        let mut m = vec![b'B', METHOD_RETURN, 0, 1];
        m.extend_from_slice(&0u32.to_be_bytes()); // body length
        m.extend_from_slice(&3u32.to_be_bytes()); // serial
        m.extend_from_slice(&8u32.to_be_bytes()); // header field array length
        m.extend_from_slice(&[FIELD_REPLY_SERIAL, 1, b'u', 0, 0, 0, 0, 2]);
        let msg = read_message(&mut m.as_slice()).unwrap();
        assert!(msg.big_endian);
        assert_eq!(
            (msg.kind, msg.serial, msg.reply_serial),
            (METHOD_RETURN, 3, Some(2))
        );
    }

    #[test]
    fn truncated_and_oversized_messages_are_errors() {
        let bytes = encode(METHOD_CALL, 1, &[(FIELD_MEMBER, Value::Str('s', "X"))], &[]).unwrap();
        assert!(read_message(&mut &bytes[..bytes.len() - 1]).is_err());
        let mut huge = bytes.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(read_message(&mut huge.as_slice()).is_err());
    }
}
