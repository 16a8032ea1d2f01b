//! The bf16 panel kernel on AMX-BF16 tiles, through `asm!` (Rust has no
//! stable AMX intrinsics): for each 16-row block of activations and each
//! 64-column panel, four 16x16 f32 sum tiles (tmm0..tmm3), each step one
//! 16x32 bf16 tile of activations (tmm4, 16 pairs of inputs per row)
//! times a 16x16-pair tile of the panel (tmm5, the panel's rows as they
//! lie: the pair layout is AMX's B operand) by `tdpbf16ps`.
//!
//! Linux refuses tile instructions (SIGILL) until the process asks for the
//! tile data state: [`permitted`] asks once per process, and the kernel is
//! never chosen when the answer is no. The tile configuration is per
//! thread: every call loads it and releases the tiles when done.
//!
//! Written on an AVX2-only box: it first ran on an AMX CPU after it was
//! written; its unit test compares it with the reference (portable_bf16.rs)
//! and an f32 product, and says when it is skipped.

use super::bf16::{Activations, TILE_K, TILE_ROWS};
use super::{Linear, PANEL};
use std::arch::asm;
use std::arch::x86_64::{__cpuid, __cpuid_count};
use std::sync::OnceLock;

/// Pair rows of the panel per B tile (16 rows of 64 bytes: 16 columns'
/// pairs each).
const TILE_PAIRS: usize = TILE_K / 2;

/// Bytes of a panel row: PANEL pairs of bf16.
const PANEL_ROW_BYTES: usize = PANEL * 4;

/// Whether the CPU has AMX-BF16 and Linux granted this process the tile
/// data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`),
/// asked once per process, before the first tile instruction.
pub(crate) fn permitted() -> bool {
    static GRANTED: OnceLock<bool> = OnceLock::new();
    *GRANTED.get_or_init(|| cpu_has_amx_bf16() && request_tile_data())
}

/// CPUID leaf 7, subleaf 0: EDX bit 22 AMX-BF16, bit 24 AMX-TILE
/// (`is_x86_feature_detected!("amx-bf16")` is not stable).
fn cpu_has_amx_bf16() -> bool {
    const AMX_BF16: u32 = 1 << 22;
    const AMX_TILE: u32 = 1 << 24;
    // Leaf 0 gives the highest leaf: leaf 7 is read only when there is one.
    if __cpuid(0).eax < 7 {
        return false;
    }
    let edx = __cpuid_count(7, 0).edx;
    edx & (AMX_BF16 | AMX_TILE) == AMX_BF16 | AMX_TILE
}

/// Asks Linux for the AMX tile data state; false where it refuses (an old
/// kernel, a CPU or hypervisor without it, another OS).
fn request_tile_data() -> bool {
    #[cfg(target_os = "linux")]
    {
        const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
        const XFEATURE_XTILEDATA: libc::c_long = 18;
        // SAFETY: arch_prctl(ARCH_REQ_XCOMP_PERM, feature) takes two
        // integers and touches no memory of ours; it fails with an error
        // code, never a signal, where the feature is not offered.
        unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            ) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    false
}

/// `ldtilecfg`'s 64 bytes: palette 1, tiles 0..=5 of 16 rows of 64 bytes
/// (tmm0..tmm3 the sums, tmm4 activations, tmm5 weights).
#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    /// Bytes per row, per tile.
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    fn new() -> TileConfig {
        let mut c = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        };
        for t in 0..6 {
            c.colsb[t] = 64;
            c.rows[t] = TILE_ROWS as u8;
        }
        c
    }
}

/// A 64-byte aligned buffer for tile loads and stores.
#[repr(C, align(64))]
struct Aligned<T>(T);

/// out[:, columns of panels lo..hi] = act x those panels of `w` + their
/// bias, on the tiles.
///
/// # Safety
/// [`permitted`] is true in this process; `act` holds m rows of lin.k,
/// padded (rows to 16, each to a multiple of 32 elements); `w` is lin's
/// pairs; `out` points at m x lin.n writable f32s, the columns of panels
/// lo..hi ours alone; hi <= lin's panels.
pub(super) unsafe fn panels(
    act: &Activations,
    m: usize,
    lin: &Linear,
    w: &[u16],
    lo: usize,
    hi: usize,
    out: *mut f32,
) {
    // SAFETY: the caller's contract; Amx's operations are the instructions,
    // which the granted tile state lets this process run.
    unsafe { panels_on(&mut Amx, act, m, lin, w, lo, hi, out) }
}

/// [`panels`] with the tile instructions emulated in plain Rust, on any
/// CPU: the kernel's own code (its tiles' addresses, strides, the k tail,
/// the stores and bias) checked where AMX is not.
///
/// # Safety
/// As [`panels`], but for the tile state.
#[cfg(test)]
pub(super) unsafe fn panels_emulated(
    act: &Activations,
    m: usize,
    lin: &Linear,
    w: &[u16],
    lo: usize,
    hi: usize,
    out: *mut f32,
) {
    let mut tiles = Emulated {
        sums: [[0.0; 256]; 4],
        a: [0; 512],
        configured: false,
    };
    // SAFETY: the caller's contract; the emulation needs no tile state.
    unsafe { panels_on(&mut tiles, act, m, lin, w, lo, hi, out) }
}

/// The tile operations the kernel is written in: tmm0..tmm3 the sums
/// (16x16 f32), tmm4 the activations (16 rows of 32 bf16), tmm5 the
/// weights (16 rows of 16 pairs).
trait Tiles {
    /// `ldtilecfg`: every tile 16 rows of 64 bytes.
    ///
    /// # Safety
    /// For the instructions: the tile state is granted.
    unsafe fn configure(&mut self, config: &TileConfig);

    /// tmm0..tmm3 = 0.
    ///
    /// # Safety
    /// Configured.
    unsafe fn zero_sums(&mut self);

    /// tmm4 = 16 rows of 64 bytes from `a`, `stride` bytes apart.
    ///
    /// # Safety
    /// Configured; those rows readable.
    unsafe fn load_a(&mut self, a: *const u16, stride: usize);

    /// tmm0..tmm3 += tmm4 x the four 16-column B tiles of 16 panel rows
    /// from `b` (rows PANEL_ROW_BYTES apart, tile t from byte 64t).
    ///
    /// # Safety
    /// Configured, tmm4 loaded; 16 panel rows from `b` readable.
    unsafe fn step(&mut self, b: *const u16);

    /// tmm0..tmm3 into `sums`: 16 rows of PANEL f32, tile t from column
    /// 16t.
    ///
    /// # Safety
    /// Configured; `sums` writable for 16 x PANEL f32.
    unsafe fn store_sums(&mut self, sums: *mut f32);

    /// `tilerelease`: the tiles back to their initial state.
    ///
    /// # Safety
    /// None beyond the instruction's: no tile is used after it without a
    /// new configuration.
    unsafe fn release(&mut self);
}

/// The kernel: for each panel and each 16-row block, the sums over whole
/// B tiles of the panel, then over the rows left, copied into a
/// zero-padded tile so that no tile reads past a panel; stored, and the
/// bias added on the way out.
///
/// # Safety
/// As [`panels`] (the tile state as `T` needs it).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn panels_on<T: Tiles>(
    tiles: &mut T,
    act: &Activations,
    m: usize,
    lin: &Linear,
    w: &[u16],
    lo: usize,
    hi: usize,
    out: *mut f32,
) {
    let (k2, n) = (lin.k.div_ceil(2), lin.n);
    assert!(
        act.stride.is_multiple_of(TILE_K)
            && act.stride >= 2 * k2
            && act.data.len() >= m.next_multiple_of(TILE_ROWS) * act.stride,
        "activations padded for tiles"
    );
    let whole = k2 / TILE_PAIRS * TILE_PAIRS;
    let rest = k2 - whole;
    let mut tail = Aligned([0u16; TILE_PAIRS * PANEL * 2]);
    let mut sums = Aligned([0f32; TILE_ROWS * PANEL]);
    let a_stride = act.stride * 2;
    // SAFETY: the caller's contract (the tile state).
    unsafe { tiles.configure(&TileConfig::new()) };
    for p in lo..hi {
        let panel = &w[p * k2 * PANEL * 2..(p + 1) * k2 * PANEL * 2];
        let c0 = p * PANEL;
        let cols = PANEL.min(n - c0);
        tail.0.fill(0);
        tail.0[..rest * PANEL * 2].copy_from_slice(&panel[whole * PANEL * 2..]);
        for r0 in (0..m).step_by(TILE_ROWS) {
            let rows = act.data[r0 * act.stride..].as_ptr();
            // SAFETY: configured above. Each A tile is 16 rows of 64 bytes
            // from row r0, element 2 * kb: inside act (rows padded to 16;
            // kb + 16 pairs within the padded stride: asserted and whole <=
            // k2, or the tail step's 2 * whole + 32 <= stride as the stride
            // is a multiple of 32 above 2 * whole). Each B tile is 16 panel
            // rows of 64 bytes from pair row kb, column 16t: inside the
            // panel (kb + 16 <= whole), or inside `tail`. The stores write
            // 16 rows of 64 bytes into `sums` (16 x 256).
            unsafe {
                tiles.zero_sums();
                for kb in (0..whole).step_by(TILE_PAIRS) {
                    tiles.load_a(rows.add(2 * kb), a_stride);
                    tiles.step(panel.as_ptr().add(kb * PANEL * 2));
                }
                if rest > 0 {
                    tiles.load_a(rows.add(2 * whole), a_stride);
                    tiles.step(tail.0.as_ptr());
                }
                tiles.store_sums(sums.0.as_mut_ptr());
            }
            for r in 0..TILE_ROWS.min(m - r0) {
                let s = &sums.0[r * PANEL..r * PANEL + cols];
                // SAFETY: row r0 + r < m, columns c0..c0 + cols of out:
                // inside the m x n matrix and ours alone.
                let o = unsafe { std::slice::from_raw_parts_mut(out.add((r0 + r) * n + c0), cols) };
                for ((o, s), b) in o.iter_mut().zip(s).zip(&lin.b[c0..c0 + cols]) {
                    *o = s + b;
                }
            }
        }
    }
    // SAFETY: no tile is used after it.
    unsafe { tiles.release() };
}

/// The AMX instructions, through `asm!`.
struct Amx;

impl Tiles for Amx {
    #[inline(always)]
    unsafe fn configure(&mut self, config: &TileConfig) {
        // SAFETY: the caller's contract; the configuration is 64 valid
        // bytes.
        unsafe { asm!("ldtilecfg [{}]", in(reg) config, options(nostack, readonly)) };
    }

    #[inline(always)]
    unsafe fn zero_sums(&mut self) {
        // SAFETY: the caller's contract.
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            )
        };
    }

    #[inline(always)]
    unsafe fn load_a(&mut self, a: *const u16, stride: usize) {
        // SAFETY: the caller's contract.
        unsafe {
            asm!(
                "tileloadd tmm4, [{a} + {s}*1]",
                a = in(reg) a,
                s = in(reg) stride,
                options(nostack, readonly)
            )
        };
    }

    #[inline(always)]
    unsafe fn step(&mut self, b: *const u16) {
        // SAFETY: the caller's contract: each tileloadd reads 16 rows of
        // 64 bytes, the t-th from byte 64t of each 256-byte panel row.
        unsafe {
            asm!(
                "tileloadd tmm5, [{b} + {s}*1]",
                "tdpbf16ps tmm0, tmm4, tmm5",
                "tileloadd tmm5, [{b} + {s}*1 + 64]",
                "tdpbf16ps tmm1, tmm4, tmm5",
                "tileloadd tmm5, [{b} + {s}*1 + 128]",
                "tdpbf16ps tmm2, tmm4, tmm5",
                "tileloadd tmm5, [{b} + {s}*1 + 192]",
                "tdpbf16ps tmm3, tmm4, tmm5",
                b = in(reg) b,
                s = in(reg) PANEL_ROW_BYTES,
                options(nostack, readonly)
            )
        };
    }

    #[inline(always)]
    unsafe fn store_sums(&mut self, sums: *mut f32) {
        // SAFETY: the caller's contract: each tilestored writes 16 rows of
        // 64 bytes, the t-th from byte 64t of each 256-byte row.
        unsafe {
            asm!(
                "tilestored [{o} + {s}*1], tmm0",
                "tilestored [{o} + {s}*1 + 64], tmm1",
                "tilestored [{o} + {s}*1 + 128], tmm2",
                "tilestored [{o} + {s}*1 + 192], tmm3",
                o = in(reg) sums,
                s = in(reg) PANEL_ROW_BYTES,
                options(nostack)
            )
        };
    }

    #[inline(always)]
    unsafe fn release(&mut self) {
        // SAFETY: returns the tiles to their initial state.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// The same operations in plain Rust, as Intel's pseudo-code defines them
/// (`tdpbf16ps`: each sum += the odd elements' product, then the even's),
/// reading and writing memory exactly where the instructions would.
#[cfg(test)]
struct Emulated {
    /// tmm0..tmm3: 16 x 16 f32 each.
    sums: [[f32; 256]; 4],
    /// tmm4: 16 rows of 32 bf16.
    a: [u16; 512],
    configured: bool,
}

#[cfg(test)]
impl Tiles for Emulated {
    unsafe fn configure(&mut self, config: &TileConfig) {
        assert_eq!((config.palette, config.start_row), (1, 0));
        for t in 0..6 {
            assert_eq!((config.rows[t], config.colsb[t]), (16, 64), "tile {t}");
        }
        self.configured = true;
    }

    unsafe fn zero_sums(&mut self) {
        assert!(self.configured);
        self.sums = [[0.0; 256]; 4];
    }

    unsafe fn load_a(&mut self, a: *const u16, stride: usize) {
        assert!(self.configured && stride.is_multiple_of(2));
        for r in 0..16 {
            for e in 0..32 {
                // SAFETY: the caller's contract: row r's 64 bytes.
                self.a[r * 32 + e] = unsafe { a.add(r * stride / 2 + e).read() };
            }
        }
    }

    unsafe fn step(&mut self, b: *const u16) {
        use super::bf16::from_bf16;
        assert!(self.configured);
        for (t, sums) in self.sums.iter_mut().enumerate() {
            for r in 0..16 {
                for j in 0..16 {
                    let mut acc = sums[r * 16 + j];
                    for kk in 0..16 {
                        // SAFETY: the caller's contract: pair row kk's 64
                        // bytes from byte 64t.
                        let pair = |e: usize| unsafe {
                            from_bf16(b.add(kk * PANEL_ROW_BYTES / 2 + 32 * t + 2 * j + e).read())
                        };
                        let x = |e: usize| from_bf16(self.a[r * 32 + 2 * kk + e]);
                        acc += x(1) * pair(1);
                        acc += x(0) * pair(0);
                    }
                    sums[r * 16 + j] = acc;
                }
            }
        }
    }

    unsafe fn store_sums(&mut self, sums: *mut f32) {
        assert!(self.configured);
        for (t, tile) in self.sums.iter().enumerate() {
            for r in 0..16 {
                for j in 0..16 {
                    // SAFETY: the caller's contract: row r's 64 bytes from
                    // byte 64t.
                    unsafe {
                        sums.add(r * PANEL_ROW_BYTES / 4 + 16 * t + j)
                            .write(tile[r * 16 + j])
                    };
                }
            }
        }
    }

    unsafe fn release(&mut self) {
        self.configured = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ldtilecfg` reads palette at byte 0, start_row at 1, tile t's bytes
    /// per row at 16 + 2t and its rows at 48 + t, 64 bytes in all.
    #[test]
    fn the_tile_configuration_is_laid_out_as_ldtilecfg_reads_it() {
        use std::mem::{align_of, offset_of, size_of};
        assert_eq!(
            (size_of::<TileConfig>(), align_of::<TileConfig>()),
            (64, 64)
        );
        assert_eq!(offset_of!(TileConfig, start_row), 1);
        assert_eq!(offset_of!(TileConfig, colsb), 16);
        assert_eq!(offset_of!(TileConfig, rows), 48);
        let c = TileConfig::new();
        // SAFETY: TileConfig is 64 plain bytes (repr(C), no padding).
        let bytes: [u8; 64] = unsafe { std::mem::transmute(c) };
        assert_eq!(bytes[0], 1, "palette 1");
        for t in 0..16 {
            let colsb = u16::from_le_bytes([bytes[16 + 2 * t], bytes[17 + 2 * t]]);
            let want = if t < 6 { (64, 16) } else { (0, 0) };
            assert_eq!((colsb, bytes[48 + t]), want, "tile {t}");
        }
    }
}
