//! The memory calls programs make on remote memory (madvise, munmap, mremap, mprotect,
//! mlock) and stacks there, with the meaning Linux gives them: real programs under `rmem
//! run`, on buffers bigger than the budget, as root and as `nobody` (userfaultfd in
//! user-mode-only mode). Each failed before (wrong data, exit 69, or SIGSEGV).

mod common;
use common::*;
use std::time::Duration;

/// Run `tests/c/memcalls.c CASE 2` (2 MiB buffers) under `rmem run` with a 1 MiB budget and
/// 16 KiB pages (four 4 KiB pieces each); returns the statistics.
fn memcalls(case: &str, as_nobody: bool) -> serde_json::Value {
    let prog = build_plain("tests/c/memcalls.c");
    let dir = scratch(&format!("memcalls-{case}-{as_nobody}"));
    let stats = dir.join("stats.json");
    let mut cmd = if as_nobody && is_root() {
        let mut c = std::process::Command::new("runuser");
        c.args(["-u", "nobody", "--"]).arg(rmem());
        c
    } else {
        std::process::Command::new(rmem())
    };
    cmd.args(["run", "--local", "1M", "--page-size", "16K", "--stats-json"])
        .arg(&stats)
        .arg("--")
        .arg(&prog)
        .args([case, "2"]);
    let out = run_bounded(&mut cmd, Duration::from_secs(60));
    assert!(
        out.status.success() && out.stdout.contains(&format!("memcalls {case}: ok")),
        "{case} (as nobody: {as_nobody}): {}\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
    let v = read_json(&stats);
    assert!(
        v["swap_ins"].as_u64().unwrap() > 0 && v["swap_outs"].as_u64().unwrap() > 0,
        "no paging: {v}"
    );
    assert_eq!(v["pieces_replaced"].as_u64(), Some(0), "{v}");
    let _ = std::fs::remove_dir_all(dir);
    v
}

/// madvise(MADV_DONTNEED) through the C library on resident and evicted pages, whole and in
/// part: zeros there, data elsewhere, and the range usable afterwards. (It was ignored: the
/// old data stayed.)
#[test]
fn madvise_dontneed_gives_zeros() {
    memcalls("madvise", false);
}

#[test]
fn madvise_dontneed_gives_zeros_as_nobody() {
    memcalls("madvise", true);
}

/// The raw system call, which rmem cannot interpose, on resident clean and dirty pages: the
/// pager gives zeros for the pieces the kernel dropped. (A clean page came back with its old
/// data; a dirty one stopped the program with "vanished from the page tables".)
#[test]
fn raw_madvise_dontneed_gives_zeros() {
    let v = memcalls("raw-madvise", false);
    assert!(v["pieces_zeroed"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn raw_madvise_dontneed_gives_zeros_as_nobody() {
    let v = memcalls("raw-madvise", true);
    assert!(v["pieces_zeroed"].as_u64().unwrap() > 0, "{v}");
}

/// madvise(MADV_FREE): whole pages freed (zeros), the rest kept, all usable afterwards.
#[test]
fn madvise_free_frees_whole_pages() {
    memcalls("free", false);
}

#[test]
fn madvise_free_frees_whole_pages_as_nobody() {
    memcalls("free", true);
}

/// MADV_FREE by the raw system call, then MADV_PAGEOUT so that the kernel frees the pages:
/// each piece reads as before or as zero (Linux's choice), never anything else, and the
/// memory is usable afterwards. (A freed piece of a modified page stopped the program.)
#[test]
fn raw_madvise_free_gives_old_data_or_zeros() {
    memcalls("raw-free", false);
}

#[test]
fn raw_madvise_free_gives_old_data_or_zeros_as_nobody() {
    memcalls("raw-free", true);
}

/// munmap of the tail of a malloc'ed block: the head keeps its data through evictions, the
/// tail goes back to the allocator, the block can still be freed. (It ended with exit 69.)
#[test]
fn munmap_of_a_tail_frees_it() {
    memcalls("munmap", false);
}

#[test]
fn munmap_of_a_tail_frees_it_as_nobody() {
    memcalls("munmap", true);
}

/// mremap: grown by moving with MREMAP_MAYMOVE (ENOMEM without), shrunk in place, data kept.
#[test]
fn mremap_moves_and_shrinks() {
    memcalls("mremap", false);
}

#[test]
fn mremap_moves_and_shrinks_as_nobody() {
    memcalls("mremap", true);
}

/// mprotect: a write to a read-only page and a read of an inaccessible one raise the
/// program's own SIGSEGV at the address, before and after the (dirty) pages were evicted and
/// fetched again; the data stays; memory freed read-only comes back read-write. (It ended
/// with exit 69.)
#[test]
fn mprotect_is_kept_across_eviction() {
    memcalls("mprotect", false);
}

#[test]
fn mprotect_is_kept_across_eviction_as_nobody() {
    memcalls("mprotect", true);
}

/// mlock: pinned pages stay resident through evictions of everything else and keep their
/// data; beyond the budget mlock and mlockall fail with ENOMEM and pin nothing; munlock,
/// mlock2(MLOCK_ONFAULT) and munlockall. (It ended with exit 69.)
#[test]
fn mlock_pins_within_the_budget() {
    memcalls("mlock", false);
}

#[test]
fn mlock_pins_within_the_budget_as_nobody() {
    memcalls("mlock", true);
}

/// Stacks in remote memory: threads on malloc'ed stacks (one too big to pin whole) making
/// system calls with stack buffers and taking signals on their stacks, and an alternate
/// signal stack, while everything else is evicted. (Unprivileged, the kernel's own writes
/// there killed the program with SIGSEGV.)
#[test]
fn threads_on_remote_stacks_and_sigaltstack() {
    memcalls("stacks", false);
}

#[test]
fn threads_on_remote_stacks_and_sigaltstack_as_nobody() {
    memcalls("stacks", true);
}
