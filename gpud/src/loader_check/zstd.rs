//! zstd-compressed layers (`application/vnd.oci.image.layer.v1.tar+zstd`,
//! `opencontainers/image-spec:layer.md`), decoded by the pure-Rust `ruzstd`.

use std::io::{self, BufRead, Read};

/// A zstd stream of one or more frames (skippable frames skipped), as
/// RFC 8878 section 3.1 allows; `ruzstd`'s own streaming decoder reads one.
pub(crate) struct ZstdFrames<R> {
    source: R,
    decoder: ruzstd::decoding::FrameDecoder,
    in_frame: bool,
}

impl<R: BufRead> ZstdFrames<R> {
    pub(crate) fn new(source: R) -> Self {
        Self {
            source,
            decoder: ruzstd::decoding::FrameDecoder::new(),
            in_frame: false,
        }
    }

    /// Starts the next frame; `false` at the end of the stream.
    fn next_frame(&mut self) -> io::Result<bool> {
        use ruzstd::decoding::errors::{FrameDecoderError as F, ReadFrameHeaderError as H};
        loop {
            if self.source.fill_buf()?.is_empty() {
                return Ok(false);
            }
            match self.decoder.init(&mut self.source) {
                Ok(()) => return Ok(true),
                Err(F::ReadFrameHeaderError(H::SkipFrame { length, .. })) => {
                    let skip = u64::from(length);
                    let n = io::copy(&mut (&mut self.source).take(skip), &mut io::sink())?;
                    if n != skip {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                }
                Err(e) => return Err(io::Error::other(e)),
            }
        }
    }
}

impl<R: BufRead> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use ruzstd::decoding::BlockDecodingStrategy;
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if !self.in_frame {
                if !self.next_frame()? {
                    return Ok(0);
                }
                self.in_frame = true;
            }
            while self.decoder.can_collect() < buf.len() && !self.decoder.is_finished() {
                let want = buf.len() - self.decoder.can_collect();
                self.decoder
                    .decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBytes(want))
                    .map_err(io::Error::other)?;
            }
            let n = self.decoder.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if self.decoder.is_finished() {
                self.in_frame = false;
            }
        }
    }
}
