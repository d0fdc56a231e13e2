//! Named regions whose pages only their creator can read.
//!
//! Under a layout that seals pages (encryption, replicas' checksums, erasure coding) or in a
//! pool, a region's pages go through its creator's page store ([`super::paged`]), and what
//! reads them back lives in that store alone: the key (made in the process, never sent),
//! each page's version (what tells a stale copy) and where each piece was placed. So an
//! opener does not attach the servers: the creator serves the region on a Unix socket in the
//! user's registry directory ([`Host`]), and an opener's pieces go there ([`Served`]), many
//! in flight, each done by the creator as its own calls are. The creator's store stays the
//! one owner of the page state; an opener's bytes cross one local socket more.
//!
//! Frames, little-endian. A request: op (u64), page (u64), offset (u32), len (u32), write
//! (u8), then `len` bytes for a write. An answer: op (u64), errno (u32, 0 for success), len
//! (u32), then `len` bytes: the data of a read, or the error's message. Only a process of
//! the same user is served (the directory is 0700, and the peer's uid is checked); a
//! malformed request closes that link with a logged reason and disturbs nothing else.

use super::{alive, answer_read, Backend, Buf, Core, Pending, Piece, RegionError, RegionStats};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const REQUEST_HEAD: usize = 25;
const ANSWER_HEAD: usize = 16;
/// Requests the creator takes at once from one link before it answers them: all of them
/// in flight together in its engine.
const BATCH_BYTES: u64 = 16 << 20;
/// How long an opener retries a socket not listening yet (the creator registers the name,
/// then listens) while the creator lives.
const CONNECT_GRACE: Duration = Duration::from_secs(2);
/// An opener whose calls have waited this long on a creator that answers nothing says so
/// (once, until it answers): a creator stopped (Ctrl-Z, SIGSTOP) holds them, as it lives.
const CREATOR_SILENT_TOLD: Duration = Duration::from_secs(10);

/// A request of an opener, as the creator holds it until answered.
struct Request {
    op: u64,
    at: u64,
    write: bool,
    /// What to write, or room for what is read.
    data: Vec<u8>,
}

/// The links of a creator's openers.
#[derive(Default)]
struct Links {
    closed: bool,
    /// Each link's stream (to shut it down) and the thread serving it.
    open: Vec<(UnixStream, JoinHandle<()>)>,
}

/// The creator's side: a listening socket, a thread per opener's link.
pub(super) struct Host {
    listener: Arc<UnixListener>,
    path: PathBuf,
    links: Arc<Mutex<Links>>,
    accept: Option<JoinHandle<()>>,
}

impl Host {
    /// Serve `core`'s region, registered as `name`, on the socket `path` (replacing a stale
    /// one: the registration, claimed before, says the name is this process's now).
    pub(super) fn start(path: PathBuf, core: Arc<Core>, name: &str) -> Result<Host, RegionError> {
        let err = |source| RegionError::Registry {
            path: path.display().to_string(),
            source,
        };
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(err)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
        let listener = Arc::new(listener);
        let links = Arc::new(Mutex::new(Links::default()));
        let (l, ls, name) = (listener.clone(), links.clone(), name.to_string());
        let accept = std::thread::Builder::new()
            .name("rmem-region-host".into())
            .spawn(move || accept_links(&l, &ls, &core, &name))
            .map_err(err)?;
        Ok(Host {
            listener,
            path,
            links,
            accept: Some(accept),
        })
    }
}

impl Drop for Host {
    /// Stop listening, close every opener's link (their calls under way fail), wait for the
    /// threads, remove the socket.
    fn drop(&mut self) {
        let open = {
            let mut ls = self.links.lock().unwrap_or_else(|e| e.into_inner());
            ls.closed = true;
            std::mem::take(&mut ls.open)
        };
        // SAFETY: shutdown(2) of our own listening socket wakes the accepting thread.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        for (stream, serving) in open {
            let _ = stream.shutdown(std::net::Shutdown::Both);
            let _ = serving.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The uid of the process at the other end of `s`.
fn peer_uid(s: &UnixStream) -> Option<u32> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED fills a ucred of the length passed.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (r == 0).then_some(cred.uid)
}

fn accept_links(listener: &UnixListener, links: &Mutex<Links>, core: &Arc<Core>, name: &str) {
    loop {
        let got = listener.accept();
        let mut ls = links.lock().unwrap_or_else(|e| e.into_inner());
        if ls.closed {
            return;
        }
        let stream = match got {
            Ok((s, _)) => s,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => {
                // Out of descriptors, say: the opener sees its link closed.
                eprintln!("rmem: region {name}: cannot take an opener's link: {e}");
                drop(ls);
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        // SAFETY: getuid cannot fail.
        let me = unsafe { libc::getuid() };
        if peer_uid(&stream) != Some(me) {
            eprintln!("rmem: region {name}: refused a link from another user");
            continue;
        }
        let Ok(shut) = stream.try_clone() else {
            continue;
        };
        let (core, name) = (core.clone(), name.to_string());
        let serving = std::thread::Builder::new()
            .name("rmem-region-link".into())
            .spawn(move || serve(stream, &core, &name));
        if let Ok(t) = serving {
            ls.open.retain(|(_, t)| !t.is_finished());
            ls.open.push((shut, t));
        }
    }
}

/// Serve one opener's link: a thread reads its requests; this one does them in batches,
/// all of a batch in flight together, and answers each in turn.
fn serve(stream: UnixStream, core: &Core, name: &str) {
    // Bounded: a link that sends faster than it reads its answers is not read meanwhile, so
    // it cannot grow the creator by what it sends.
    let queued = (BATCH_BYTES as usize / core.page_size).max(1) * 2;
    let (tx, rx) = mpsc::sync_channel(queued);
    let Ok(mut input) = stream.try_clone() else {
        return;
    };
    let (size, page_size, who) = (core.size, core.page_size as u64, name.to_string());
    let reader = std::thread::Builder::new()
        .name("rmem-region-read".into())
        .spawn(move || loop {
            match read_request(&mut input, size, page_size) {
                Ok(Some(r)) => {
                    if tx.send(r).is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(why) => {
                    eprintln!("rmem: region {who}: closing an opener's link: {why}");
                    let _ = input.shutdown(std::net::Shutdown::Both);
                    return;
                }
            }
        });
    let Ok(reader) = reader else {
        return;
    };
    let mut out = stream;
    'link: while let Ok(first) = rx.recv() {
        let mut bytes = first.data.len() as u64;
        let mut batch = vec![first];
        while bytes < BATCH_BYTES {
            let Ok(r) = rx.try_recv() else {
                break;
            };
            bytes += r.data.len() as u64;
            batch.push(r);
        }
        let jobs: Vec<_> = batch
            .iter_mut()
            .map(|r| {
                let range = (r.at, Buf(r.data.as_mut_ptr()), r.data.len());
                core.queue(&[range], r.write)
            })
            .collect();
        for (r, job) in batch.iter().zip(jobs) {
            let done = job.and_then(|j| j.map_or(Ok(()), |j| core.wait(&j)));
            let answer = match done {
                Ok(()) if r.write => answer_frame(r.op, 0, &[]),
                Ok(()) => answer_frame(r.op, 0, &r.data),
                Err(e) => {
                    // The opener says "the region is unusable" itself.
                    let errno = e.errno() as u32;
                    let why = match e {
                        RegionError::Failed(why) => why,
                        e => e.to_string(),
                    };
                    answer_frame(r.op, errno, why.as_bytes())
                }
            };
            if out.write_all(&answer).is_err() {
                break 'link;
            }
        }
    }
    let _ = out.shutdown(std::net::Shutdown::Both);
    // The reader may wait to queue a request (the queue full): it is released by the queue's
    // end, not by the link's.
    drop(rx);
    let _ = reader.join();
}

fn answer_frame(op: u64, errno: u32, body: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(ANSWER_HEAD + body.len());
    f.extend_from_slice(&op.to_le_bytes());
    f.extend_from_slice(&errno.to_le_bytes());
    f.extend_from_slice(&(body.len() as u32).to_le_bytes());
    f.extend_from_slice(body);
    f
}

/// The next request on a link (`None` at its end), checked against the region: a range
/// within one page, inside the region.
fn read_request(
    input: &mut impl Read,
    size: u64,
    page_size: u64,
) -> Result<Option<Request>, String> {
    let mut head = [0u8; REQUEST_HEAD];
    match input.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(None),
        Err(e) => return Err(format!("reading a request: {e}")),
    }
    let u64_at = |i: usize| u64::from_le_bytes(head[i..i + 8].try_into().expect("8 bytes"));
    let u32_at = |i: usize| u32::from_le_bytes(head[i..i + 4].try_into().expect("4 bytes"));
    let (op, page, offset, len) = (u64_at(0), u64_at(8), u32_at(16), u32_at(20));
    let write = match head[24] {
        0 => false,
        1 => true,
        b => {
            return Err(format!(
                "request {op}: kind {b} is neither read (0) nor write (1)"
            ))
        }
    };
    let (offset, len) = (u64::from(offset), u64::from(len));
    let at = page
        .checked_mul(page_size)
        .and_then(|a| a.checked_add(offset))
        .filter(|a| a.checked_add(len).is_some_and(|end| end <= size));
    let Some(at) = at.filter(|_| len > 0 && offset + len <= page_size) else {
        return Err(format!(
            "request {op}: {len} bytes at offset {offset} of page {page} are not a range \
             within one page of the region ({size} bytes, pages of {page_size})"
        ));
    };
    let mut data = vec![0u8; len as usize];
    if write {
        input
            .read_exact(&mut data)
            .map_err(|e| format!("request {op}: reading its {len} bytes: {e}"))?;
    }
    Ok(Some(Request {
        op,
        at,
        write,
        data,
    }))
}

/// An opener's side: its pieces go to the creator on one link.
pub(super) struct Served {
    link: UnixStream,
    creator: u32,
    name: String,
    /// Since when the creator has answered nothing while pieces waited, and whether that was
    /// said.
    silent_since: Option<Instant>,
    told: bool,
    pending: Pending,
    /// Requests not yet taken by the socket.
    out: Vec<u8>,
    /// Answers read and not yet whole.
    input: Vec<u8>,
}

impl Served {
    /// Connect to the region `name`'s creator (process `creator`) on `socket`.
    pub(super) fn connect(socket: &Path, creator: u32, name: &str) -> Result<Served, RegionError> {
        let started = Instant::now();
        let link = loop {
            match UnixStream::connect(socket) {
                Ok(s) => break s,
                Err(e)
                    if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused)
                        && alive(creator)
                        && started.elapsed() < CONNECT_GRACE =>
                {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => {
                    return Err(RegionError::NoSuchName {
                        name: name.into(),
                        why: format!(
                            "its creator (process {creator}) does not answer on {}: {e}",
                            socket.display()
                        ),
                    })
                }
            }
        };
        link.set_nonblocking(true)
            .map_err(|source| RegionError::Registry {
                path: socket.display().to_string(),
                source,
            })?;
        Ok(Served {
            link,
            creator,
            name: name.into(),
            silent_since: None,
            told: false,
            pending: Pending::default(),
            out: Vec::new(),
            input: Vec::new(),
        })
    }

    /// The link is gone: the creator freed the region or exited.
    fn gone(&self, detail: &str) -> RegionError {
        let how = if alive(self.creator) {
            "freed it"
        } else {
            "exited"
        };
        RegionError::Failed(format!(
            "the region's creator (process {}) {how}: {detail}",
            self.creator
        ))
    }

    /// Answer the pieces whose answers are whole in `input`; how many.
    fn answer(&mut self, stats: &RegionStats) -> Result<usize, RegionError> {
        let mut at = 0;
        let mut answers = 0;
        while self.input.len() - at >= ANSWER_HEAD {
            let h = &self.input[at..at + ANSWER_HEAD];
            let op = u64::from_le_bytes(h[0..8].try_into().expect("8 bytes"));
            let errno = u32::from_le_bytes(h[8..12].try_into().expect("4 bytes"));
            let len = u32::from_le_bytes(h[12..16].try_into().expect("4 bytes")) as usize;
            if self.input.len() - at - ANSWER_HEAD < len {
                break;
            }
            let body = &self.input[at + ANSWER_HEAD..at + ANSWER_HEAD + len];
            at += ANSWER_HEAD + len;
            answers += 1;
            self.silent_since = None;
            if std::mem::take(&mut self.told) {
                eprintln!(
                    "rmem: region {}: its creator (process {}) answers again",
                    self.name, self.creator
                );
            }
            let Some(p) = self.pending.take(op) else {
                return Err(self.gone(&format!("it answered request {op}, which is not asked")));
            };
            let why = || String::from_utf8_lossy(body).into_owned();
            match errno as i32 {
                0 if p.write => p.job.answered(None),
                0 if len == p.len as usize => {
                    stats.bytes_fetched.fetch_add(len as u64, Relaxed);
                    answer_read(&p, body);
                }
                0 => {
                    let e = format!("it answered a read of {} bytes with {len}", p.len);
                    p.job.answered(Some(RegionError::Failed(e.clone())));
                    return Err(self.gone(&e));
                }
                libc::ENOSPC => p.job.answered(Some(RegionError::NoRoom(why()))),
                libc::EINVAL => p.job.answered(Some(RegionError::Invalid(why()))),
                _ => {
                    // The creator's region failed: so does this one.
                    let e = RegionError::Failed(why());
                    p.job.answered(Some(RegionError::Failed(why())));
                    return Err(e);
                }
            }
        }
        self.input.drain(..at);
        Ok(answers)
    }
}

impl Backend for Served {
    fn submit(&mut self, p: Piece, stats: &RegionStats) -> Result<(), RegionError> {
        let op = self.pending.next_op();
        self.out.extend_from_slice(&op.to_le_bytes());
        self.out.extend_from_slice(&p.page.to_le_bytes());
        self.out.extend_from_slice(&p.offset.to_le_bytes());
        self.out.extend_from_slice(&p.len.to_le_bytes());
        self.out.push(u8::from(p.write));
        if p.write {
            // SAFETY: the caller's buffer, `len` bytes from `buf`, borrowed while it waits.
            let data = unsafe { std::slice::from_raw_parts(p.buf.0, p.len as usize) };
            self.out.extend_from_slice(data);
            stats.bytes_sent.fetch_add(p.len.into(), Relaxed);
        }
        stats.requests.fetch_add(1, Relaxed);
        self.pending.insert(op, p);
        Ok(())
    }

    fn inflight_bytes(&self) -> u64 {
        self.pending.bytes
    }

    fn busy(&self) -> bool {
        !self.pending.ops.is_empty()
    }

    fn flush(&mut self, _now: Instant) -> Result<(), RegionError> {
        let mut sent = 0;
        while sent < self.out.len() {
            match self.link.write(&self.out[sent..]) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.gone(&e.to_string())),
            }
        }
        self.out.drain(..sent);
        Ok(())
    }

    fn pollfds(&self, out: &mut Vec<libc::pollfd>) {
        let write = if self.out.is_empty() {
            0
        } else {
            libc::POLLOUT
        };
        out.push(libc::pollfd {
            fd: self.link.as_raw_fd(),
            events: libc::POLLIN | write,
            revents: 0,
        });
    }

    fn take_answers(&mut self, _now: Instant, stats: &RegionStats) -> Result<usize, RegionError> {
        let mut buf = [0u8; 64 << 10];
        loop {
            match self.link.read(&mut buf) {
                Ok(0) => {
                    // Whatever came before the end is answered first.
                    self.answer(stats)?;
                    return Err(self.gone("its link closed"));
                }
                Ok(n) => self.input.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.gone(&e.to_string())),
            }
        }
        self.answer(stats)
    }

    fn tick(&mut self, now: Instant) -> Result<(), RegionError> {
        if !self.busy() {
            self.silent_since = None;
            return Ok(());
        }
        let since = *self.silent_since.get_or_insert(now);
        if !self.told && now.saturating_duration_since(since) >= CREATOR_SILENT_TOLD {
            self.told = true;
            eprintln!(
                "rmem: region {}: its creator (process {}) has answered nothing for {} s while \
                 calls wait; they wait for it (is it stopped? under this layout the creator \
                 serves the region)",
                self.name,
                self.creator,
                CREATOR_SILENT_TOLD.as_secs()
            );
        }
        Ok(())
    }

    fn drain(&mut self) -> Vec<Piece> {
        self.pending.drain()
    }

    /// The creator's sessions are its own: nothing to end.
    fn end_sessions(&mut self) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(op: u64, page: u64, offset: u32, len: u32, kind: u8) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&op.to_le_bytes());
        f.extend_from_slice(&page.to_le_bytes());
        f.extend_from_slice(&offset.to_le_bytes());
        f.extend_from_slice(&len.to_le_bytes());
        f.push(kind);
        f.extend(std::iter::repeat_n(
            7u8,
            if kind == 1 { len as usize } else { 0 },
        ));
        f
    }

    #[test]
    fn requests_outside_a_page_or_the_region_are_refused() {
        let (size, ps) = (10_000u64, 4096u64);
        let ok = read_request(&mut &request(1, 2, 100, 1000, 1)[..], size, ps).unwrap();
        let r = ok.expect("a request");
        assert_eq!(
            (r.op, r.at, r.write, r.data.len()),
            (1, 2 * 4096 + 100, true, 1000)
        );
        assert!(read_request(&mut &[][..], size, ps).unwrap().is_none());
        for (what, f) in [
            ("0 bytes", request(2, 0, 0, 0, 0)),
            ("across a page", request(3, 0, 4000, 200, 0)),
            ("past the end", request(4, 2, 1800, 100, 0)),
            ("a page far out", request(5, u64::MAX / 2, 0, 1, 0)),
            ("a bad kind", request(6, 0, 0, 1, 9)),
        ] {
            let e = read_request(&mut &f[..], size, ps).err();
            assert!(e.is_some(), "{what} was taken");
        }
        // A write cut short.
        let mut cut = request(7, 0, 0, 100, 1);
        cut.truncate(REQUEST_HEAD + 10);
        assert!(read_request(&mut &cut[..], size, ps).is_err());
    }
}
