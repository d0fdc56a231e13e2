//! The NBD protocol, server side, with no I/O: the fixed newstyle handshake as a state
//! machine over bytes ([`Handshake`]), transmission requests ([`parse_request`]) and replies.
//!
//! Follows the protocol document (NetworkBlockDevice/nbd, doc/proto.md). Supported: fixed
//! newstyle with NO_ZEROES; options EXPORT_NAME, GO, INFO, LIST, ABORT, STRUCTURED_REPLY
//! (others, STARTTLS included, answer ERR_UNSUP); infos EXPORT, NAME, DESCRIPTION and
//! BLOCK_SIZE; commands READ, WRITE, DISC, FLUSH, TRIM and WRITE_ZEROES with FUA. Anything
//! that breaks the protocol is a [`ProtoError`]: the connection is closed with it as the
//! logged reason. Every length is checked before anything is allocated.

#![forbid(unsafe_code)]

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const REPLY_MAGIC_OPT: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// The transmission flags of this server's exports: every command it serves, and a FLUSH on
/// one connection covers the writes answered on all ([`crate::server`]).
pub const SERVED_FLAGS: u16 = FLAG_HAS_FLAGS
    | FLAG_SEND_FLUSH
    | FLAG_SEND_FUA
    | FLAG_SEND_TRIM
    | FLAG_SEND_WRITE_ZEROES
    | FLAG_CAN_MULTI_CONN;

pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;

pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

/// Error values of replies (the protocol's, which are Linux's errno values).
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const ESHUTDOWN: u32 = 108;

/// Most bytes of option data accepted (names are at most 4096 bytes; an INFO request adds a
/// few info types).
pub const OPTION_LEN_MAX: u32 = 64 * 1024;
/// Bytes of a request header.
pub const REQUEST_LEN: usize = 28;

/// The export a server offers, as the handshake describes it.
#[derive(Clone, Debug)]
pub struct Export {
    pub name: String,
    pub description: String,
    pub size_bytes: u64,
    /// Transmission flags (`FLAG_*`), HAS_FLAGS included.
    pub flags: u16,
    pub block_min: u32,
    pub block_preferred: u32,
    pub block_max: u32,
}

impl Export {
    /// Whether a client asking for `name` means this export ("" is the default export).
    pub fn answers_to(&self, name: &[u8]) -> bool {
        name.is_empty() || name == self.name.as_bytes()
    }
}

/// A violation of the protocol: the connection is closed with this as the logged reason.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtoError {
    #[error("client flags {0:#x} have bits this server does not know")]
    ClientFlags(u32),
    #[error("client did not ask for fixed newstyle negotiation")]
    NotFixedNewstyle,
    #[error("option magic {0:#018x} is not IHAVEOPT")]
    OptionMagic(u64),
    #[error("option {option} carries {len} bytes, more than {OPTION_LEN_MAX}")]
    OptionTooLong { option: u32, len: u32 },
    #[error("the client asked for export {0:?}, which does not exist")]
    NoSuchExport(String),
    #[error("request magic {0:#010x} is wrong")]
    RequestMagic(u32),
    #[error("a write of {len} bytes is over the maximum of {max}")]
    WriteTooLong { len: u32, max: u32 },
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Where a handshake is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    ClientFlags,
    Options,
}

/// What the handshake wants next.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// More bytes are needed.
    More,
    /// Negotiation is over: transmission starts with the bytes after the consumed ones.
    Transmission,
    /// The client aborted (after the answer in `out`, if any): close.
    Close,
}

/// The server side of the fixed newstyle handshake.
#[derive(Debug)]
pub struct Handshake {
    phase: Phase,
    no_zeroes: bool,
    /// Structured replies were negotiated.
    pub structured: bool,
}

impl Default for Handshake {
    fn default() -> Self {
        Handshake::new()
    }
}

impl Handshake {
    pub fn new() -> Handshake {
        Handshake {
            phase: Phase::ClientFlags,
            no_zeroes: false,
            structured: false,
        }
    }

    /// What the server sends first.
    pub fn greeting() -> Vec<u8> {
        let mut g = Vec::with_capacity(18);
        g.extend_from_slice(&NBDMAGIC.to_be_bytes());
        g.extend_from_slice(&IHAVEOPT.to_be_bytes());
        g.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        g
    }

    /// Take what the client sent from `input`, append the answers to `out`. Returns how many
    /// bytes were consumed and what comes next; call again while it consumes and says More.
    pub fn advance(
        &mut self,
        input: &[u8],
        export: &Export,
        out: &mut Vec<u8>,
    ) -> Result<(usize, Next), ProtoError> {
        match self.phase {
            Phase::ClientFlags => {
                if input.len() < 4 {
                    return Ok((0, Next::More));
                }
                let f = u32_at(input, 0);
                if f & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
                    return Err(ProtoError::ClientFlags(f));
                }
                if f & FLAG_C_FIXED_NEWSTYLE == 0 {
                    // Plain newstyle allows only EXPORT_NAME; every client today asks for
                    // fixed newstyle, and refusing is what the document allows.
                    return Err(ProtoError::NotFixedNewstyle);
                }
                self.no_zeroes = f & FLAG_C_NO_ZEROES != 0;
                self.phase = Phase::Options;
                Ok((4, Next::More))
            }
            Phase::Options => {
                if input.len() < 16 {
                    return Ok((0, Next::More));
                }
                let magic = u64_at(input, 0);
                if magic != IHAVEOPT {
                    return Err(ProtoError::OptionMagic(magic));
                }
                let option = u32_at(input, 8);
                let len = u32_at(input, 12);
                if len > OPTION_LEN_MAX {
                    return Err(ProtoError::OptionTooLong { option, len });
                }
                let total = 16 + len as usize;
                if input.len() < total {
                    return Ok((0, Next::More));
                }
                let data = &input[16..total];
                let next = self.option(option, data, export, out)?;
                Ok((total, next))
            }
        }
    }

    fn option(
        &mut self,
        option: u32,
        data: &[u8],
        export: &Export,
        out: &mut Vec<u8>,
    ) -> Result<Next, ProtoError> {
        match option {
            OPT_EXPORT_NAME => {
                if !export.answers_to(data) {
                    return Err(ProtoError::NoSuchExport(
                        String::from_utf8_lossy(data).into_owned(),
                    ));
                }
                out.extend_from_slice(&export.size_bytes.to_be_bytes());
                out.extend_from_slice(&export.flags.to_be_bytes());
                if !self.no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                Ok(Next::Transmission)
            }
            OPT_ABORT => {
                option_reply(out, option, REP_ACK, &[]);
                Ok(Next::Close)
            }
            OPT_LIST => {
                if !data.is_empty() {
                    option_error(out, option, REP_ERR_INVALID, "LIST takes no data");
                    return Ok(Next::More);
                }
                let mut d = Vec::with_capacity(4 + export.name.len());
                d.extend_from_slice(&(export.name.len() as u32).to_be_bytes());
                d.extend_from_slice(export.name.as_bytes());
                d.extend_from_slice(export.description.as_bytes());
                option_reply(out, option, REP_SERVER, &d);
                option_reply(out, option, REP_ACK, &[]);
                Ok(Next::More)
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    option_error(
                        out,
                        option,
                        REP_ERR_INVALID,
                        "STRUCTURED_REPLY takes no data",
                    );
                    return Ok(Next::More);
                }
                self.structured = true;
                option_reply(out, option, REP_ACK, &[]);
                Ok(Next::More)
            }
            OPT_INFO | OPT_GO => self.info(option, data, export, out),
            OPT_STARTTLS => {
                option_error(out, option, REP_ERR_UNSUP, "TLS is not supported");
                Ok(Next::More)
            }
            _ => {
                option_error(out, option, REP_ERR_UNSUP, "option not supported");
                Ok(Next::More)
            }
        }
    }

    /// NBD_OPT_INFO and NBD_OPT_GO: name length, name, count of info requests, requests.
    fn info(
        &mut self,
        option: u32,
        data: &[u8],
        export: &Export,
        out: &mut Vec<u8>,
    ) -> Result<Next, ProtoError> {
        let parsed = (|| {
            let name_len = u32_at(data.get(..4)?, 0) as usize;
            let name = data.get(4..4usize.checked_add(name_len)?)?;
            let count = u16_at(data.get(4 + name_len..6 + name_len)?, 0) as usize;
            let reqs = data.get(6 + name_len..)?;
            if reqs.len() != 2 * count {
                return None;
            }
            Some((name, reqs))
        })();
        let Some((name, reqs)) = parsed else {
            option_error(out, option, REP_ERR_INVALID, "malformed INFO/GO request");
            return Ok(Next::More);
        };
        if !export.answers_to(name) {
            option_error(
                out,
                option,
                REP_ERR_UNKNOWN,
                &format!(
                    "no export named {:?} (this server has {:?})",
                    String::from_utf8_lossy(name),
                    export.name
                ),
            );
            return Ok(Next::More);
        }
        let mut d = Vec::with_capacity(12);
        d.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        d.extend_from_slice(&export.size_bytes.to_be_bytes());
        d.extend_from_slice(&export.flags.to_be_bytes());
        option_reply(out, option, REP_INFO, &d);
        // Block sizes are sent whether asked or not: the minimum is 1, so a client that does
        // not know them loses nothing.
        d.clear();
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        d.extend_from_slice(&export.block_min.to_be_bytes());
        d.extend_from_slice(&export.block_preferred.to_be_bytes());
        d.extend_from_slice(&export.block_max.to_be_bytes());
        option_reply(out, option, REP_INFO, &d);
        for r in reqs.chunks(2).map(|c| u16_at(c, 0)) {
            let text = match r {
                INFO_NAME => &export.name,
                INFO_DESCRIPTION => &export.description,
                _ => continue,
            };
            d.clear();
            d.extend_from_slice(&r.to_be_bytes());
            d.extend_from_slice(text.as_bytes());
            option_reply(out, option, REP_INFO, &d);
        }
        option_reply(out, option, REP_ACK, &[]);
        Ok(if option == OPT_GO {
            Next::Transmission
        } else {
            Next::More
        })
    }
}

/// Append an option reply.
pub fn option_reply(out: &mut Vec<u8>, option: u32, kind: u32, data: &[u8]) {
    out.extend_from_slice(&REPLY_MAGIC_OPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
}

fn option_error(out: &mut Vec<u8>, option: u32, kind: u32, message: &str) {
    option_reply(out, option, kind, message.as_bytes());
}

/// A transmission command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    WriteZeroes,
    /// A command this server does not support: answered EINVAL.
    Other(u16),
}

impl Command {
    fn of(t: u16) -> Command {
        match t {
            0 => Command::Read,
            1 => Command::Write,
            2 => Command::Disc,
            3 => Command::Flush,
            4 => Command::Trim,
            6 => Command::WriteZeroes,
            t => Command::Other(t),
        }
    }

    /// The command's number on the wire (what [`Command::of`] reads back).
    pub fn code(self) -> u16 {
        match self {
            Command::Read => 0,
            Command::Write => 1,
            Command::Disc => 2,
            Command::Flush => 3,
            Command::Trim => 4,
            Command::WriteZeroes => 6,
            Command::Other(t) => t,
        }
    }
}

/// A request header (a write's payload follows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: Command,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    /// Bytes of payload that follow the header.
    pub fn payload_len(&self) -> usize {
        if self.command == Command::Write {
            self.length as usize
        } else {
            0
        }
    }
}

/// The next request in `input`, if its header is all there. A write longer than `write_max`
/// is refused before its payload is read: its bytes cannot be skipped safely, so the
/// connection closes.
pub fn parse_request(input: &[u8], write_max: u32) -> Result<Option<Request>, ProtoError> {
    if input.len() < REQUEST_LEN {
        return Ok(None);
    }
    let magic = u32_at(input, 0);
    if magic != REQUEST_MAGIC {
        return Err(ProtoError::RequestMagic(magic));
    }
    let r = Request {
        flags: u16_at(input, 4),
        command: Command::of(u16_at(input, 6)),
        cookie: u64_at(input, 8),
        offset: u64_at(input, 16),
        length: u32_at(input, 24),
    };
    if r.command == Command::Write && r.length > write_max {
        return Err(ProtoError::WriteTooLong {
            len: r.length,
            max: write_max,
        });
    }
    Ok(Some(r))
}

/// Append a simple reply (no payload follows, or a read's data follows it).
pub fn simple_reply(out: &mut Vec<u8>, cookie: u64, error: u32) {
    out.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
}

/// Append the header of a structured reply's one and final data chunk of `len` bytes at
/// `offset`; the data follows.
pub fn structured_data_header(out: &mut Vec<u8>, cookie: u64, offset: u64, len: u32) {
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
    out.extend_from_slice(&REPLY_TYPE_OFFSET_DATA.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&(8 + len).to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
}

/// Append a structured error reply (final) with a message for the user.
pub fn structured_error(out: &mut Vec<u8>, cookie: u64, error: u32, message: &str) {
    let msg = &message.as_bytes()[..message.len().min(4096)];
    out.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
    out.extend_from_slice(&REPLY_TYPE_ERROR.to_be_bytes());
    out.extend_from_slice(&cookie.to_be_bytes());
    out.extend_from_slice(&(6 + msg.len() as u32).to_be_bytes());
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export() -> Export {
        Export {
            name: "rmem".into(),
            description: "remote memory".into(),
            size_bytes: 1 << 30,
            flags: FLAG_HAS_FLAGS | FLAG_SEND_FLUSH,
            block_min: 1,
            block_preferred: 4096,
            block_max: 32 << 20,
        }
    }

    fn opt(option: u32, data: &[u8]) -> Vec<u8> {
        let mut v = IHAVEOPT.to_be_bytes().to_vec();
        v.extend_from_slice(&option.to_be_bytes());
        v.extend_from_slice(&(data.len() as u32).to_be_bytes());
        v.extend_from_slice(data);
        v
    }

    /// Option replies in `out`: (option, type, data).
    fn replies(mut out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
        let mut r = Vec::new();
        while !out.is_empty() {
            assert_eq!(u64_at(out, 0), REPLY_MAGIC_OPT);
            let len = u32_at(out, 16) as usize;
            r.push((u32_at(out, 8), u32_at(out, 12), out[20..20 + len].to_vec()));
            out = &out[20 + len..];
        }
        r
    }

    /// Feed all of `input` to a new handshake (after the client flags).
    fn run(input: &[u8]) -> (Handshake, Vec<u8>, Result<Next, ProtoError>) {
        let mut h = Handshake::new();
        let mut out = Vec::new();
        let mut all = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES)
            .to_be_bytes()
            .to_vec();
        all.extend_from_slice(input);
        let mut at = 0;
        loop {
            match h.advance(&all[at..], &export(), &mut out) {
                Ok((0, Next::More)) => return (h, out, Ok(Next::More)),
                Ok((n, Next::More)) => at += n,
                Ok((_, next)) => return (h, out, Ok(next)),
                Err(e) => return (h, out, Err(e)),
            }
        }
    }

    #[test]
    fn greeting_is_magic_and_fixed_newstyle() {
        let g = Handshake::greeting();
        assert_eq!(&g[..8], b"NBDMAGIC");
        assert_eq!(&g[8..16], b"IHAVEOPT");
        assert_eq!(u16_at(&g, 16), 3);
    }

    #[test]
    fn go_answers_export_and_block_size_then_transmits() {
        let mut d = 4u32.to_be_bytes().to_vec();
        d.extend_from_slice(b"rmem");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        d.extend_from_slice(&INFO_NAME.to_be_bytes());
        let (_, out, next) = run(&opt(OPT_GO, &d));
        assert_eq!(next, Ok(Next::Transmission));
        let r = replies(&out);
        assert_eq!(r.len(), 4);
        assert_eq!(r[0].1, REP_INFO);
        assert_eq!(u16_at(&r[0].2, 0), INFO_EXPORT);
        assert_eq!(u64_at(&r[0].2, 2), 1 << 30);
        assert_eq!(u16_at(&r[1].2, 0), INFO_BLOCK_SIZE);
        assert_eq!(
            (u32_at(&r[1].2, 2), u32_at(&r[1].2, 6), u32_at(&r[1].2, 10)),
            (1, 4096, 32 << 20)
        );
        assert_eq!(&r[2].2[2..], b"rmem");
        assert_eq!(r[3].1, REP_ACK);
    }

    #[test]
    fn info_on_an_unknown_export_is_an_error_and_negotiation_goes_on() {
        let mut d = 3u32.to_be_bytes().to_vec();
        d.extend_from_slice(b"foo");
        d.extend_from_slice(&0u16.to_be_bytes());
        let mut input = opt(OPT_INFO, &d);
        input.extend(opt(OPT_INFO, &[0, 0, 0, 9])); // name length beyond the data
        input.extend(opt(OPT_LIST, &[]));
        input.extend(opt(OPT_STRUCTURED_REPLY, &[]));
        input.extend(opt(99, &[1, 2]));
        input.extend(opt(OPT_EXPORT_NAME, b""));
        let (h, out, next) = run(&input);
        assert_eq!(next, Ok(Next::Transmission));
        assert!(h.structured);
        let r = replies(&out[..out.len() - 10]);
        let kinds: Vec<u32> = r.iter().map(|r| r.1).collect();
        assert_eq!(
            kinds,
            [
                REP_ERR_UNKNOWN,
                REP_ERR_INVALID,
                REP_SERVER,
                REP_ACK,
                REP_ACK,
                REP_ERR_UNSUP
            ]
        );
        assert_eq!(&r[2].2[..8], &[0, 0, 0, 4, b'r', b'm', b'e', b'm']);
        // EXPORT_NAME's answer: size and flags, no zeroes (asked away).
        assert_eq!(u64_at(&out, out.len() - 10), 1 << 30);
    }

    #[test]
    fn a_partial_option_waits_and_bad_input_is_an_error() {
        let input = opt(OPT_LIST, &[]);
        let (_, out, next) = run(&input[..10]);
        assert_eq!((out.len(), next), (0, Ok(Next::More)));
        let mut bad = opt(OPT_LIST, &[]);
        bad[0] = 0;
        assert!(matches!(run(&bad).2, Err(ProtoError::OptionMagic(_))));
        let mut long = IHAVEOPT.to_be_bytes().to_vec();
        long.extend_from_slice(&OPT_GO.to_be_bytes());
        long.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(matches!(
            run(&long).2,
            Err(ProtoError::OptionTooLong { .. })
        ));
        assert!(matches!(
            run(&opt(OPT_EXPORT_NAME, b"other")).2,
            Err(ProtoError::NoSuchExport(_))
        ));
        assert_eq!(run(&opt(OPT_ABORT, &[])).2, Ok(Next::Close));
        let mut h = Handshake::new();
        let e = h.advance(&[0, 0, 0, 4], &export(), &mut Vec::new());
        assert_eq!(e, Err(ProtoError::ClientFlags(4)));
        let e = Handshake::new().advance(&[0, 0, 0, 0], &export(), &mut Vec::new());
        assert_eq!(e, Err(ProtoError::NotFixedNewstyle));
    }

    #[test]
    fn command_numbers_read_back() {
        for t in 0..=16u16 {
            assert_eq!(Command::of(t).code(), t);
        }
        assert_eq!(
            Command::of(Command::WriteZeroes.code()),
            Command::WriteZeroes
        );
    }

    #[test]
    fn requests_parse_and_oversized_writes_are_refused() {
        let mut r = REQUEST_MAGIC.to_be_bytes().to_vec();
        r.extend_from_slice(&CMD_FLAG_FUA.to_be_bytes());
        r.extend_from_slice(&1u16.to_be_bytes());
        r.extend_from_slice(&7u64.to_be_bytes());
        r.extend_from_slice(&4096u64.to_be_bytes());
        r.extend_from_slice(&512u32.to_be_bytes());
        assert_eq!(parse_request(&r[..27], 1024), Ok(None));
        let q = parse_request(&r, 1024).unwrap().unwrap();
        assert_eq!(
            (q.command, q.cookie, q.offset, q.length, q.payload_len()),
            (Command::Write, 7, 4096, 512, 512)
        );
        assert!(matches!(
            parse_request(&r, 256),
            Err(ProtoError::WriteTooLong { .. })
        ));
        r[6..8].copy_from_slice(&5u16.to_be_bytes());
        assert_eq!(
            parse_request(&r, 256).unwrap().unwrap().command,
            Command::Other(5)
        );
        r[0] = 0;
        assert!(matches!(
            parse_request(&r, 256),
            Err(ProtoError::RequestMagic(_))
        ));
    }

    #[test]
    fn replies_are_laid_out_as_the_document_says() {
        let mut out = Vec::new();
        structured_data_header(&mut out, 9, 4096, 100);
        assert_eq!(out.len(), 28);
        assert_eq!(u32_at(&out, 0), STRUCTURED_REPLY_MAGIC);
        assert_eq!(u16_at(&out, 4), REPLY_FLAG_DONE);
        assert_eq!(u32_at(&out, 16), 108);
        out.clear();
        structured_error(&mut out, 9, EINVAL, "bad");
        assert_eq!(u32_at(&out, 16), 9);
        assert_eq!(u32_at(&out, 20), EINVAL);
        out.clear();
        simple_reply(&mut out, 9, EIO);
        assert_eq!(out.len(), 16);
    }
}
