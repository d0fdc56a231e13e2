//! A TCP proxy in front of a real memory server, for tests of links that fail: it can stop
//! passing bytes (a stopped process: links up, nothing answered) and go on again, cut every
//! link it carries while it goes on accepting (a network fault; the server and its sessions
//! stay), or vanish, listener and links (a killed server: a reconnect is refused). Include it
//! with `#[path = "common/proxy.rs"] mod proxy;`.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub struct Proxy {
    pub addr: String,
    stalled: Arc<AtomicBool>,
    killed: Arc<AtomicBool>,
    /// Both ends of every link carried, for `cut`.
    links: Arc<Mutex<Vec<TcpStream>>>,
}

#[allow(dead_code)] // each test file uses some of it
impl Proxy {
    pub fn start(real: String) -> Proxy {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.set_nonblocking(true).unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let stalled = Arc::new(AtomicBool::new(false));
        let killed = Arc::new(AtomicBool::new(false));
        let links: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (st, ki, ls) = (stalled.clone(), killed.clone(), links.clone());
        std::thread::spawn(move || {
            while !ki.load(Relaxed) {
                match l.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let up = TcpStream::connect(&real).unwrap();
                        // As the real ends do (Nagle's algorithm would hold small answers
                        // for the client's delayed ack: a late read, hedged elsewhere).
                        client.set_nodelay(true).unwrap();
                        up.set_nodelay(true).unwrap();
                        let mut held = ls.lock().unwrap();
                        held.push(client.try_clone().unwrap());
                        held.push(up.try_clone().unwrap());
                        drop(held);
                        pump(
                            client.try_clone().unwrap(),
                            up.try_clone().unwrap(),
                            &st,
                            &ki,
                        );
                        pump(up, client, &st, &ki);
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(2))
                    }
                    Err(e) => panic!("proxy accept: {e}"),
                }
            }
            // The listener is dropped here: connecting to the port is refused from now on.
        });
        Proxy {
            addr,
            stalled,
            killed,
            links,
        }
    }

    /// Stop passing bytes, both ways, at once (links stay up).
    pub fn stall(&self) {
        self.stalled.store(true, Relaxed);
    }

    pub fn resume(&self) {
        self.stalled.store(false, Relaxed);
    }

    /// Close every link carried now, both ways; new ones are still accepted. How many.
    pub fn cut(&self) -> usize {
        let mut held = self.links.lock().unwrap();
        for s in held.iter() {
            let _ = s.shutdown(Shutdown::Both);
        }
        let n = held.len() / 2;
        held.clear();
        n
    }

    /// Gone: the listener closes within a few ms, the links at once.
    pub fn kill(&self) {
        self.killed.store(true, Relaxed);
        self.cut();
        let deadline = Instant::now() + Duration::from_secs(2);
        while TcpStream::connect(&self.addr).is_ok() {
            assert!(Instant::now() < deadline, "the proxy's port still accepts");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.killed.store(true, Relaxed);
        self.cut();
    }
}

/// Copy `from` to `to` while not stalled; close both once killed or either end closes.
fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    stalled: &Arc<AtomicBool>,
    killed: &Arc<AtomicBool>,
) {
    let (stalled, killed) = (stalled.clone(), killed.clone());
    from.set_read_timeout(Some(Duration::from_millis(2)))
        .unwrap();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while !killed.load(Relaxed) {
            if stalled.load(Relaxed) {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    // Stalled while this was read: held until resumed, so that a stall takes
                    // effect at once for every byte not yet passed on.
                    while stalled.load(Relaxed) && !killed.load(Relaxed) {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    if killed.load(Relaxed) || to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
        let _ = from.shutdown(Shutdown::Both);
        let _ = to.shutdown(Shutdown::Both);
    });
}
