//! The on-disk format of one checkpoint file: header, postcard envelope, payload and trailing
//! checksum, as laid out in the [module documentation](super). This file encodes and checks
//! bytes; it knows nothing of directories.

use std::borrow::Cow;
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use super::blobs::StoredGroup;
use super::errors::{CheckpointError, CorruptionError};
use super::meta::LostName;

/// The file format version this build writes and reads.
pub const FORMAT_VERSION: u16 = 2;

/// Payloads longer than this many bytes (1 MiB) are compressed with zstd.
pub const COMPRESSION_THRESHOLD: usize = 1024 * 1024;

/// The first bytes of every checkpoint file.
const MAGIC: [u8; 8] = *b"PYVCKPT\0";

/// Header flag: the payload is a zstd frame.
const FLAG_ZSTD: u16 = 1;

/// zstd's default level: fast enough for 10 MB payloads, and pickles compress well at it.
const ZSTD_LEVEL: i32 = 3;

/// Length of the fixed header.
pub(super) const HEADER_LEN: usize = 32;

/// Length of the trailing checksum.
pub(super) const TRAILER_LEN: usize = 4;

/// The largest envelope a checkpoint may carry (16 MiB of names).
pub(super) const MAX_ENVELOPE_BYTES: usize = 16 * 1024 * 1024;

/// The metadata stored in front of the payload, encoded with postcard.
///
/// Changing its fields changes the file format: bump [`FORMAT_VERSION`].
#[derive(Debug, Serialize, Deserialize)]
pub(super) struct Envelope {
    pub session: String,
    pub sequence: u64,
    pub execution_count: u64,
    pub created_at_ms: u64,
    pub payload_bytes: u64,
    pub names_saved: Vec<String>,
    pub names_lost: Vec<LostName>,
    /// The groups of names whose values are in blobs beside the file (format 2).
    pub groups: Vec<StoredGroup>,
}

/// An envelope encoded with postcard, no longer than [`MAX_ENVELOPE_BYTES`].
pub(super) struct EncodedEnvelope(Vec<u8>);

impl Envelope {
    /// Encodes the envelope, refusing one larger than [`MAX_ENVELOPE_BYTES`].
    pub fn encode(&self) -> Result<EncodedEnvelope, CheckpointError> {
        let bytes = postcard::to_allocvec(self)
            .expect("postcard encodes a struct of strings, integers and vectors");
        if bytes.len() > MAX_ENVELOPE_BYTES {
            return Err(CheckpointError::MetadataTooLarge {
                bytes: bytes.len() as u64,
                limit: MAX_ENVELOPE_BYTES as u64,
            });
        }
        Ok(EncodedEnvelope(bytes))
    }
}

/// A payload as it will be stored: compressed when that pays.
pub(super) struct StoredPayload<'a> {
    bytes: Cow<'a, [u8]>,
    compressed: bool,
}

impl StoredPayload<'_> {
    /// Whether the payload is stored compressed.
    pub fn compressed(&self) -> bool {
        self.compressed
    }
}

/// Compresses a payload above [`COMPRESSION_THRESHOLD`], keeping it as it is when
/// compression does not make it smaller (a pickle of random floats, say).
pub(super) fn prepare_payload(payload: &[u8]) -> io::Result<StoredPayload<'_>> {
    if payload.len() > COMPRESSION_THRESHOLD {
        let compressed = zstd::bulk::compress(payload, ZSTD_LEVEL)?;
        if compressed.len() < payload.len() {
            return Ok(StoredPayload {
                bytes: Cow::Owned(compressed),
                compressed: true,
            });
        }
    }
    Ok(StoredPayload {
        bytes: Cow::Borrowed(payload),
        compressed: false,
    })
}

/// The validated fixed header of a checkpoint file.
struct Header {
    compressed: bool,
    envelope_len: u32,
    stored_len: u64,
    envelope_crc: u32,
}

impl Header {
    fn encode(&self) -> [u8; HEADER_LEN] {
        let flags = if self.compressed { FLAG_ZSTD } else { 0 };
        let mut bytes = [0u8; HEADER_LEN];
        bytes[0..8].copy_from_slice(&MAGIC);
        bytes[8..10].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        bytes[10..12].copy_from_slice(&flags.to_le_bytes());
        bytes[12..16].copy_from_slice(&self.envelope_len.to_le_bytes());
        bytes[16..24].copy_from_slice(&self.stored_len.to_le_bytes());
        bytes[24..28].copy_from_slice(&self.envelope_crc.to_le_bytes());
        let header_crc = crc32fast::hash(&bytes[..28]);
        bytes[28..32].copy_from_slice(&header_crc.to_le_bytes());
        bytes
    }

    fn decode(bytes: &[u8; HEADER_LEN]) -> Result<Self, CorruptionError> {
        if bytes[0..8] != MAGIC {
            return Err(CorruptionError::BadMagic);
        }
        // The version comes before the checksum: another version may lay its header out
        // differently.
        let version = u16::from_le_bytes([bytes[8], bytes[9]]);
        if version != FORMAT_VERSION {
            return Err(CorruptionError::UnsupportedVersion { version });
        }
        let header_crc = u32::from_le_bytes([bytes[28], bytes[29], bytes[30], bytes[31]]);
        if crc32fast::hash(&bytes[..28]) != header_crc {
            return Err(CorruptionError::HeaderChecksum);
        }
        let flags = u16::from_le_bytes([bytes[10], bytes[11]]);
        if flags & !FLAG_ZSTD != 0 {
            return Err(CorruptionError::UnknownFlags { flags });
        }
        let header = Self {
            compressed: flags & FLAG_ZSTD != 0,
            envelope_len: u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]),
            stored_len: u64::from_le_bytes([
                bytes[16], bytes[17], bytes[18], bytes[19], bytes[20], bytes[21], bytes[22],
                bytes[23],
            ]),
            envelope_crc: u32::from_le_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]),
        };
        if header.envelope_len as usize > MAX_ENVELOPE_BYTES {
            return Err(CorruptionError::Oversized {
                bytes: header.file_len(),
            });
        }
        Ok(header)
    }

    /// The length of the whole file this header describes (saturating: a corrupt length
    /// must not overflow).
    fn file_len(&self) -> u64 {
        ((HEADER_LEN + TRAILER_LEN) as u64)
            .saturating_add(u64::from(self.envelope_len))
            .saturating_add(self.stored_len)
    }

    /// Checks the header's idea of the file length against the actual one.
    fn check_len(&self, actual: u64) -> Result<(), CorruptionError> {
        let expected = self.file_len();
        if actual < expected {
            Err(CorruptionError::Truncated { expected, actual })
        } else if actual > expected {
            Err(CorruptionError::TrailingBytes { expected, actual })
        } else {
            Ok(())
        }
    }
}

/// Writes a whole checkpoint file and returns its length.
pub(super) fn write_file<W: Write>(
    out: &mut W,
    envelope: &EncodedEnvelope,
    payload: &StoredPayload<'_>,
) -> io::Result<u64> {
    let header = Header {
        compressed: payload.compressed,
        envelope_len: u32::try_from(envelope.0.len())
            .expect("an encoded envelope is at most MAX_ENVELOPE_BYTES long"),
        stored_len: payload.bytes.len() as u64,
        envelope_crc: crc32fast::hash(&envelope.0),
    };
    let header_bytes = header.encode();
    let mut crc = crc32fast::Hasher::new();
    for part in [&header_bytes[..], &envelope.0, &payload.bytes] {
        crc.update(part);
        out.write_all(part)?;
    }
    out.write_all(&crc.finalize().to_le_bytes())?;
    Ok(header.file_len())
}

/// What the header and envelope of a file say, without its payload.
pub(super) struct Summary {
    pub envelope: Envelope,
    pub compressed: bool,
}

/// Reads and checks the header and envelope of a file of `file_len` bytes, leaving the payload
/// unread and its checksum unchecked.
pub(super) fn read_summary<R: Read>(
    input: &mut R,
    file_len: u64,
) -> Result<Summary, CorruptionError> {
    let truncated = |err: io::Error, expected: u64| {
        if err.kind() == io::ErrorKind::UnexpectedEof {
            CorruptionError::Truncated {
                expected,
                actual: file_len,
            }
        } else {
            CorruptionError::Read(err)
        }
    };
    let mut header_bytes = [0u8; HEADER_LEN];
    input
        .read_exact(&mut header_bytes)
        .map_err(|err| truncated(err, HEADER_LEN as u64))?;
    let header = Header::decode(&header_bytes)?;
    header.check_len(file_len)?;
    let mut envelope_bytes = vec![0u8; header.envelope_len as usize];
    input
        .read_exact(&mut envelope_bytes)
        .map_err(|err| truncated(err, header.file_len()))?;
    Ok(Summary {
        envelope: decode_envelope(&envelope_bytes, header.envelope_crc)?,
        compressed: header.compressed,
    })
}

/// A fully checked checkpoint file.
pub(super) struct Decoded {
    pub envelope: Envelope,
    pub compressed: bool,
    pub payload: Vec<u8>,
}

/// Checks every byte of a checkpoint file and returns its metadata and payload, refusing a
/// payload longer than `max_payload` bytes.
pub(super) fn decode_file(bytes: &[u8], max_payload: u64) -> Result<Decoded, CorruptionError> {
    let actual = bytes.len() as u64;
    let header_bytes: &[u8; HEADER_LEN] = bytes
        .get(..HEADER_LEN)
        .and_then(|head| head.try_into().ok())
        .ok_or(CorruptionError::Truncated {
            expected: HEADER_LEN as u64,
            actual,
        })?;
    let header = Header::decode(header_bytes)?;
    header.check_len(actual)?;

    // From here the lengths add up to the file's, so the slices below are in bounds.
    let body_end = bytes.len() - TRAILER_LEN;
    let (body, trailer) = bytes.split_at(body_end);
    let stored_crc = u32::from_le_bytes([trailer[0], trailer[1], trailer[2], trailer[3]]);
    if crc32fast::hash(body) != stored_crc {
        return Err(CorruptionError::Checksum);
    }
    let (envelope_bytes, stored) = body[HEADER_LEN..].split_at(header.envelope_len as usize);
    let envelope = decode_envelope(envelope_bytes, header.envelope_crc)?;

    let expected = envelope.payload_bytes;
    if expected > max_payload {
        return Err(CorruptionError::TooLarge {
            bytes: expected,
            limit: max_payload,
        });
    }
    let payload = if header.compressed {
        // `expected <= max_payload`, which came from a usize.
        let capacity = usize::try_from(expected).expect("the payload limit fits in usize");
        zstd::bulk::decompress(stored, capacity).map_err(CorruptionError::Decompress)?
    } else {
        stored.to_vec()
    };
    if payload.len() as u64 != expected {
        return Err(CorruptionError::PayloadLength {
            expected,
            actual: payload.len() as u64,
        });
    }
    Ok(Decoded {
        envelope,
        compressed: header.compressed,
        payload,
    })
}

fn decode_envelope(bytes: &[u8], crc: u32) -> Result<Envelope, CorruptionError> {
    if crc32fast::hash(bytes) != crc {
        return Err(CorruptionError::EnvelopeChecksum);
    }
    postcard::from_bytes(bytes).map_err(CorruptionError::Envelope)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn envelope(payload_bytes: usize) -> Envelope {
        Envelope {
            session: "s".into(),
            sequence: 3,
            execution_count: 7,
            created_at_ms: 1_700_000_000_000,
            payload_bytes: payload_bytes as u64,
            names_saved: vec!["x".into()],
            names_lost: vec![LostName {
                name: "sock".into(),
                reason: "cannot pickle 'socket' object".into(),
            }],
            groups: Vec::new(),
        }
    }

    fn file_with(payload: &[u8]) -> Vec<u8> {
        let stored = prepare_payload(payload).expect("compress");
        let mut file = Vec::new();
        let len = write_file(
            &mut file,
            &envelope(payload.len()).encode().expect("encode"),
            &stored,
        )
        .expect("write to a Vec");
        assert_eq!(len, file.len() as u64);
        file
    }

    #[test]
    fn small_payload_is_stored_as_is_and_decodes() {
        let file = file_with(b"pickled");
        let decoded = decode_file(&file, 1 << 20).expect("decode");
        assert!(!decoded.compressed);
        assert_eq!(decoded.payload, b"pickled");
        assert_eq!(decoded.envelope.names_lost[0].name, "sock");
        assert_eq!(&file[..8], b"PYVCKPT\0");
    }

    #[test]
    fn large_compressible_payload_is_compressed_and_decodes() {
        let payload = vec![7u8; COMPRESSION_THRESHOLD + 1];
        let file = file_with(&payload);
        assert!(file.len() < payload.len() / 10);
        let decoded = decode_file(&file, 1 << 30).expect("decode");
        assert!(decoded.compressed);
        assert_eq!(decoded.payload, payload);
    }

    #[test]
    fn summary_reads_metadata_without_the_payload() {
        let file = file_with(&[1u8; 1000]);
        // The reader holds the header, the envelope and only part of the payload.
        let summary =
            read_summary(&mut &file[..file.len() - 500], file.len() as u64).expect("summary");
        assert_eq!(summary.envelope.sequence, 3);
        assert_eq!(summary.envelope.payload_bytes, 1000);
    }

    #[test]
    fn payload_above_the_load_limit_is_refused() {
        let file = file_with(&[1u8; 100]);
        assert!(matches!(
            decode_file(&file, 99),
            Err(CorruptionError::TooLarge {
                bytes: 100,
                limit: 99
            })
        ));
    }

    #[test]
    fn every_flipped_byte_is_detected() {
        let file = file_with(b"0123456789");
        for at in 0..file.len() {
            let mut bad = file.clone();
            bad[at] ^= 0x40;
            assert!(
                decode_file(&bad, 1 << 20).is_err(),
                "flip at {at} undetected"
            );
        }
    }

    /// Rewrites every checksum of a (mutated) file so that its checks pass.
    fn forge_checksums(file: &mut [u8]) {
        let envelope_len = u32::from_le_bytes([file[12], file[13], file[14], file[15]]) as usize;
        let envelope_end = (HEADER_LEN + envelope_len).min(file.len() - TRAILER_LEN);
        let envelope_crc = crc32fast::hash(&file[HEADER_LEN..envelope_end]);
        file[24..28].copy_from_slice(&envelope_crc.to_le_bytes());
        let header_crc = crc32fast::hash(&file[..28]);
        file[28..32].copy_from_slice(&header_crc.to_le_bytes());
        let body_end = file.len() - TRAILER_LEN;
        let file_crc = crc32fast::hash(&file[..body_end]);
        file[body_end..].copy_from_slice(&file_crc.to_le_bytes());
    }

    proptest::proptest! {
        /// Behind the checksums, postcard and zstd see garbage only when someone forged them;
        /// even then decoding must fail cleanly, not panic or allocate without bound.
        #[test]
        fn garbage_behind_forged_checksums_never_panics(
            compressed in proptest::prelude::any::<bool>(),
            flips in proptest::collection::vec(
                (proptest::prelude::any::<proptest::sample::Index>(), 1u8..=255),
                1..8,
            ),
        ) {
            let payload = if compressed {
                vec![3u8; COMPRESSION_THRESHOLD + 1]
            } else {
                b"payload".to_vec()
            };
            let mut file = file_with(&payload);
            // Mutate past the magic, version and flags, which are checked before anything else.
            let mutable = file.len() - 12 - TRAILER_LEN;
            for (at, mask) in flips {
                file[12 + at.index(mutable)] ^= mask;
            }
            forge_checksums(&mut file);
            let _ = decode_file(&file, 4 * COMPRESSION_THRESHOLD as u64);
            let _ = read_summary(&mut &file[..], file.len() as u64);
        }
    }

    #[test]
    fn other_versions_and_flags_are_refused() {
        for version in [1, 3] {
            let mut file = file_with(b"x");
            file[8] = version;
            assert!(matches!(
                decode_file(&file, 1 << 20),
                Err(CorruptionError::UnsupportedVersion { version: v }) if v == u16::from(version)
            ));
        }

        let mut file = file_with(b"x");
        file[10] = 0x02;
        let header_crc = crc32fast::hash(&file[..28]);
        file[28..32].copy_from_slice(&header_crc.to_le_bytes());
        assert!(matches!(
            decode_file(&file, 1 << 20),
            Err(CorruptionError::UnknownFlags { flags: 0x02 })
        ));
    }
}
