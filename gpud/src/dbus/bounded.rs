//! The bus connection's read side, bounded before anything is decoded
//! (issue 38, F9).
//!
//! zbus reads each incoming message whole into memory, up to the D-Bus
//! specification's 128 MiB, before it looks at what it is; the bus broker
//! relays messages up to its own `max_message_size` (32 MiB by default for
//! dbus-daemon). Eight 32 MB calls from the plugin's UID took amd-gpud to
//! 731 MB. No method of ours takes more than a few KiB (the largest,
//! `InspectContainer`, refuses a run spec over 32 KiB), so this read half
//! looks at each message's fixed header (16 bytes: the D-Bus
//! specification's "Message Format") first: a message that declares more
//! than [`MAX_INCOMING`] bytes is read through a 64 KiB buffer and dropped,
//! with a warning naming its size, and its caller gets no answer; every
//! other message goes to zbus as before. Memory per message is then bounded
//! by [`MAX_INCOMING`] whatever the broker allows. A length above the
//! specification's own maximum is refused as zbus refuses it (the
//! connection ends), never read.
//!
//! amd-gpud takes no file descriptor in any call, so this read side does not
//! offer to pass them: zbus then never negotiates it, the bus relays none,
//! and any that came anyway are closed unread, so that a message's
//! descriptors cannot be mistaken for another's.

use std::{io, os::fd::OwnedFd};

use tracing::warn;
use zbus::{
    Message,
    conn::AuthMechanism,
    connection::socket::{BoxedSplit, ReadHalf, Split, WriteHalf},
    fdo::ConnectionCredentials,
};

/// The largest message amd-gpud reads: far above any call of its API.
pub(crate) const MAX_INCOMING: usize = 1024 * 1024;
/// The fixed part of a message's header, with the length of its fields.
const FIXED_HEADER: usize = 16;
/// What a dropped message is read through.
const DISCARD_CHUNK: usize = 64 * 1024;
/// The D-Bus specification's largest message (zbus's `MAX_MESSAGE_SIZE`).
const SPEC_MAX: u64 = 128 * 1024 * 1024;

/// The whole length a message's fixed header declares: the header, its
/// fields padded to 8 bytes, the body. `None` when the first byte is no
/// endianness mark (zbus then refuses the message itself).
fn declared_len(fixed: &[u8; FIXED_HEADER]) -> Option<u64> {
    let word = |at: usize| [fixed[at], fixed[at + 1], fixed[at + 2], fixed[at + 3]];
    let read: fn([u8; 4]) -> u32 = match fixed[0] {
        b'l' => u32::from_le_bytes,
        b'B' => u32::from_be_bytes,
        _ => return None,
    };
    let body = u64::from(read(word(4)));
    let fields = u64::from(read(word(12)));
    let header = (FIXED_HEADER as u64 + fields).next_multiple_of(8);
    Some(header + body)
}

/// A unix socket's read half that drops messages over a size bound unread.
#[derive(Debug)]
pub(crate) struct BoundedRead<R> {
    inner: R,
    max: usize,
}

impl<R: ReadHalf> BoundedRead<R> {
    /// Reads from `buf`'s end until it holds `len` bytes (descriptors sent
    /// with them are closed: see the module documentation).
    async fn fill(&mut self, buf: &mut Vec<u8>, len: usize) -> io::Result<()> {
        while buf.len() < len {
            let start = buf.len();
            buf.resize(len, 0);
            let received = self.inner.recvmsg(&mut buf[start..]).await;
            let read = received.as_ref().map_or(0, |(read, _fds)| *read);
            buf.truncate(start + read);
            if received?.0 == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(())
    }

    /// Reads and forgets `left` bytes, and any descriptor sent with them.
    async fn discard(&mut self, mut left: u64) -> io::Result<()> {
        let mut chunk = vec![0; DISCARD_CHUNK];
        while left > 0 {
            let want = usize::try_from(left)
                .unwrap_or(DISCARD_CHUNK)
                .min(DISCARD_CHUNK);
            let (read, _fds) = self.inner.recvmsg(&mut chunk[..want]).await?;
            if read == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            left -= read as u64;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl<R: ReadHalf> ReadHalf for BoundedRead<R> {
    async fn receive_message(
        &mut self,
        seq: u64,
        already_received_bytes: &mut Vec<u8>,
        already_received_fds: &mut Vec<OwnedFd>,
    ) -> zbus::Result<Message> {
        loop {
            let buf = &mut *already_received_bytes;
            self.fill(buf, FIXED_HEADER).await?;
            let mut fixed = [0; FIXED_HEADER];
            fixed.copy_from_slice(&buf[..FIXED_HEADER]);
            let declared = declared_len(&fixed);
            match declared {
                Some(len) if len > SPEC_MAX => return Err(zbus::Error::ExcessData),
                Some(len) if len > self.max as u64 => {
                    warn!(
                        bytes = len,
                        max = self.max,
                        "dropping an incoming D-Bus message over the size bound, unread; its sender gets no answer"
                    );
                    let buffered = buf.len().min(usize::try_from(len).unwrap_or(usize::MAX));
                    buf.drain(..buffered);
                    already_received_fds.clear();
                    self.discard(len - buffered as u64).await?;
                    // A stream of them must not hold the runtime's one thread.
                    tokio::task::yield_now().await;
                }
                _ => {
                    return self
                        .inner
                        .receive_message(seq, buf, already_received_fds)
                        .await;
                }
            }
        }
    }

    async fn recvmsg(&mut self, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
        self.inner.recvmsg(buf).await
    }

    /// No call of amd-gpud's API takes a descriptor (module documentation).
    fn can_pass_unix_fd(&self) -> bool {
        false
    }

    async fn peer_credentials(&mut self) -> io::Result<ConnectionCredentials> {
        self.inner.peer_credentials().await
    }

    fn auth_mechanism(&self) -> AuthMechanism {
        self.inner.auth_mechanism()
    }
}

/// `stream` as zbus's socket, its read side bounded to `max` bytes a message.
pub(crate) fn bounded_socket(stream: tokio::net::UnixStream, max: usize) -> BoxedSplit {
    let (read, write) = stream.into_split();
    let read: Box<dyn ReadHalf> = Box::new(BoundedRead { inner: read, max });
    let write: Box<dyn WriteHalf> = Box::new(write);
    Split::new(read, write)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixed(endian: u8, body: u32, fields: u32) -> [u8; FIXED_HEADER] {
        let mut header = [0; FIXED_HEADER];
        header[0] = endian;
        header[1] = 1; // a method call
        header[3] = 1; // protocol version
        let (body, fields) = if endian == b'B' {
            (body.to_be_bytes(), fields.to_be_bytes())
        } else {
            (body.to_le_bytes(), fields.to_le_bytes())
        };
        header[4..8].copy_from_slice(&body);
        header[12..16].copy_from_slice(&fields);
        header
    }

    #[test]
    fn the_declared_length_pads_the_fields_and_adds_the_body() {
        assert_eq!(declared_len(&fixed(b'l', 0, 0)), Some(16));
        // 16 + 61 = 77 bytes of header, padded to 80, then the body.
        assert_eq!(declared_len(&fixed(b'l', 100, 61)), Some(180));
        assert_eq!(declared_len(&fixed(b'B', 100, 61)), Some(180));
    }

    #[test]
    fn the_largest_declared_lengths_do_not_overflow() {
        let most = u64::from(u32::MAX);
        let header = (16 + most).next_multiple_of(8);
        assert_eq!(
            declared_len(&fixed(b'l', u32::MAX, u32::MAX)),
            Some(header + most)
        );
    }

    #[test]
    fn no_endianness_mark_is_left_to_zbus() {
        assert_eq!(declared_len(&fixed(b'x', 1, 1)), None);
    }
}
