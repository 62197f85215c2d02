//! The machine's memory read bandwidth with 1..T threads: the bound on generation speed
//! (a decode step reads every weight byte once, so tg ≤ bandwidth ÷ bytes per token).
//!
//! ```sh
//! cargo run --release -p frink-models --example bandwidth -- [-t T] [-r R] [FILE.gguf]
//! ```
//!
//! Two sources, each streamed by T threads (contiguous equal parts, one per thread, all
//! started together; a pass's time runs from the start to the last thread's end). Of R
//! passes two figures are reported: the best pass (the peak, as the machine is shared) and
//! the median pass: a pass is one read of the source (tens of milliseconds), a tg figure an
//! average over seconds, and on a shared VM the best of R short windows lands on quiet
//! moments that no run of seconds sees (measured here on one AMD Zen 5 VM: best passes of
//! 46.4, 60.6 and 47.3 GB/s in three probes minutes apart). Each thread reads its part in three
//! ways and the fastest is the figure: one sequential stream; one stream with software
//! prefetch 4 KiB ahead (the hardware prefetchers stop at 4 KiB page boundaries: measured
//! 10.3 -> 13.7 GB/s on one core here); four interleaved streams (quarters of the part)
//! with prefetch 1 KiB ahead (15.9 GB/s on one core, 30.6 on two, against 20.0 for plain
//! streams): the read bandwidth a kernel can actually reach.
//! - `anon`: a 1 GiB anonymous buffer (four times this machine's 260 MiB L3, so every pass
//!   comes from DRAM), written once before timing.
//! - `file`: with FILE, the tensor data of a GGUF file through the same read-only mapping
//!   frink and llama.cpp read their weights from (page-cache pages, read once before
//!   timing so that no pass waits on the disk). This is the figure a decode step can reach.
//!
//! Output: one line per source and thread count, then with `--json` one JSON object
//! `{"anon": [best-pass GB/s for 1..T threads], "anon_median": [median-pass GB/s], "file":
//! [...], "file_median": [...]}` as the last line (GB = 1e9 bytes).

use std::time::Instant;

/// How a thread reads its part: `(streams, prefetch distance in bytes)`.
const STRATEGIES: [(usize, usize); 3] = [(1, 0), (1, 4096), (4, 1024)];

/// Reads `data` as `streams` interleaved sequential streams (equal parts, one 64-byte line
/// of each in turn), prefetching `pf` bytes ahead of each (0: none); returns a sum of the
/// words.
fn stream_with(data: &[u8], streams: usize, pf: usize) -> u64 {
    // SAFETY: [u64; 8] has no invalid bit patterns; align_to only reinterprets the aligned
    // middle of the slice, whose length it computes.
    #[allow(unsafe_code)]
    let (head, lines, tail) = unsafe { data.align_to::<[u64; 8]>() };
    let part = lines.len() / streams;
    let mut acc = [0u64; 8];
    for i in 0..part {
        for s in 0..streams {
            let line = &lines[s * part + i];
            #[cfg(target_arch = "x86_64")]
            if pf > 0 {
                // SAFETY: SSE is part of x86-64's baseline; a prefetch never faults,
                // whatever the address, and reads nothing architecturally.
                #[allow(unsafe_code)]
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                        (line as *const [u64; 8]).cast::<i8>().wrapping_add(pf),
                    );
                }
            }
            for (a, w) in acc.iter_mut().zip(line) {
                *a = a.wrapping_add(*w);
            }
        }
    }
    let rest = lines[streams * part..]
        .iter()
        .flatten()
        .fold(0u64, |s, w| s.wrapping_add(*w));
    let bytes: u64 = head.iter().chain(tail).map(|&b| b as u64).sum();
    acc.iter()
        .fold(rest.wrapping_add(bytes), |s, a| s.wrapping_add(*a))
}

/// Sums the bytes of `data` as u64 words in eight independent lanes (the loads are what is
/// measured; the sum keeps the compiler from dropping them).
fn stream(data: &[u8]) -> u64 {
    let (head, words, tail) = {
        // SAFETY: u64 has no invalid bit patterns; align_to only reinterprets the aligned
        // middle of the slice, whose length it computes.
        #[allow(unsafe_code)]
        unsafe {
            data.align_to::<u64>()
        }
    };
    let mut acc = [0u64; 8];
    let mut chunks = words.chunks_exact(8);
    for c in &mut chunks {
        for (a, w) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(*w);
        }
    }
    let rest: u64 = chunks.remainder().iter().fold(0, |s, w| s.wrapping_add(*w));
    let bytes: u64 = head.iter().chain(tail).map(|&b| b as u64).sum();
    acc.iter()
        .fold(rest.wrapping_add(bytes), |s, a| s.wrapping_add(*a))
}

/// GB/s of `reps` passes of `threads` threads over `parts` (all parts, split evenly by
/// bytes among the threads), each thread reading as `how` says: `(best pass, median pass)`.
fn measure(parts: &[&[u8]], threads: usize, reps: usize, how: (usize, usize)) -> (f64, f64) {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    // Each thread's share: a list of sub-slices covering total / threads bytes.
    let per = total.div_ceil(threads);
    let mut shares: Vec<Vec<&[u8]>> = vec![Vec::new(); threads];
    let (mut t, mut filled) = (0, 0);
    for p in parts {
        let mut p: &[u8] = p;
        while !p.is_empty() {
            let take = (per - filled).min(p.len());
            shares[t].push(&p[..take]);
            p = &p[take..];
            filled += take;
            if filled == per && t + 1 < threads {
                t += 1;
                filled = 0;
            }
        }
    }
    let mut times = Vec::with_capacity(reps);
    let mut sink = 0u64;
    for _ in 0..reps {
        let barrier = std::sync::Barrier::new(threads);
        let start = std::sync::OnceLock::new();
        let sums: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = shares
                .iter()
                .map(|share| {
                    let (barrier, start) = (&barrier, &start);
                    s.spawn(move || {
                        barrier.wait();
                        start.get_or_init(Instant::now);
                        share
                            .iter()
                            .map(|p| stream_with(p, how.0, how.1))
                            .fold(0u64, u64::wrapping_add)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let secs = start.get().unwrap().elapsed().as_secs_f64();
        sink = sums.iter().fold(sink, |a, b| a.wrapping_add(*b));
        times.push(secs);
    }
    std::hint::black_box(sink);
    times.sort_by(f64::total_cmp);
    let rate = |secs: f64| total as f64 / secs / 1e9;
    (rate(times[0]), rate(times[times.len() / 2]))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let (mut threads, mut reps, mut file, mut json) = (2usize, 7usize, None, false);
    while let Some(a) = args.next() {
        match a.as_str() {
            "-t" => threads = args.next().and_then(|v| v.parse().ok()).expect("-t N"),
            "-r" => reps = args.next().and_then(|v| v.parse().ok()).expect("-r N"),
            "--json" => json = true,
            _ => file = Some(a),
        }
    }
    let mut out = serde_json::Map::new();
    let anon: Vec<u8> = (0..1usize << 30).map(|i| i as u8).collect();
    let mut report = |name: &str, parts: &[&[u8]]| {
        stream_all(parts);
        let mib = parts.iter().map(|p| p.len()).sum::<usize>() >> 20;
        let (mut rates, mut medians) = (Vec::new(), Vec::new());
        for t in 1..=threads {
            let each: Vec<(f64, f64)> = STRATEGIES
                .iter()
                .map(|&how| measure(parts, t, reps, how))
                .collect();
            let best = each.iter().map(|e| e.0).fold(0.0, f64::max);
            let median = each.iter().map(|e| e.1).fold(0.0, f64::max);
            eprintln!(
                "{name:>4} {mib:>6} MiB  {t} thread(s): {best:6.1} GB/s best pass, {median:6.1} median \
                 (best / median: plain {:.1} / {:.1}, prefetch {:.1} / {:.1}, 4 streams {:.1} / {:.1})",
                each[0].0, each[0].1, each[1].0, each[1].1, each[2].0, each[2].1
            );
            rates.push(best);
            medians.push(median);
        }
        out.insert(name.into(), serde_json::json!(rates));
        out.insert(format!("{name}_median"), serde_json::json!(medians));
    };
    report("anon", &[&anon]);
    drop(anon);
    if let Some(path) = file {
        let f = frink_gguf::GgufFile::open(&path).expect("a GGUF file");
        let parts: Vec<&[u8]> = (0..f.tensor_infos().len())
            .map(|i| f.tensor_at(i).data)
            .collect();
        report("file", &parts);
    }
    if json {
        println!("{}", serde_json::Value::Object(out));
    }
}

/// One untimed pass (page faults, the page cache).
fn stream_all(parts: &[&[u8]]) {
    std::hint::black_box(
        parts
            .iter()
            .map(|p| stream(p))
            .fold(0u64, u64::wrapping_add),
    );
}
