//! The scale searches of a Q4_K or Q5_K super-block's 8 sub-blocks run side by side: lane
//! `k` of every array is sub-block `k`, and each lane performs exactly the operations of
//! [`super::kquants::make_qkx2_quants`] on its sub-block, in the same order, so each
//! lane's results have its bits. A branch of the one-block search is a per-lane choice
//! here (all arms computed, one kept), which lets the compiler run the 8 lanes in SIMD
//! registers. Q4_K's file quantization spends most of its time in this search.

use crate::dot::quantize::nearest_int;

/// Sub-blocks searched at once.
pub(super) const LANES: usize = 8;
/// Values per sub-block.
const N: usize = 32;

/// One value per lane.
pub(super) type Lanes = [f32; LANES];

/// `a * b` lane by lane.
#[inline(always)]
fn mul(a: &Lanes, b: &Lanes) -> Lanes {
    std::array::from_fn(|k| a[k] * b[k])
}

/// [`super::kquants::make_qkx2_quants`] (`MAD`, `V3` as there) for the sub-blocks
/// `x[i][k]` (value `i` of sub-block `k`) with weights `w`: returns each lane's scale,
/// its quants in `l[i][k]` and minus its minimum in `the_min`.
pub(super) fn make_qkx_lanes<const MAD: bool, const V3: bool>(
    nmax: i32,
    x: &[Lanes; N],
    w: &[Lanes; N],
    l: &mut [[u8; LANES]; N],
    the_min: &mut Lanes,
    (rmin, rdelta, nstep): (f32, f32, i32),
) -> Lanes {
    let nmaxf = nmax as f32;
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = mul(&sum_w, &x[0]);
    for i in 1..N {
        for k in 0..LANES {
            if x[i][k] < min[k] {
                min[k] = x[i][k];
            }
            if x[i][k] > max[k] {
                max[k] = x[i][k];
            }
            sum_w[k] += w[i][k];
            sum_x[k] += w[i][k] * x[i][k];
        }
    }
    for m in &mut min {
        if *m > 0.0 {
            *m = 0.0;
        }
    }
    let flat: [bool; LANES] = std::array::from_fn(|k| max[k] == min[k]);
    let first_min = min;
    let err = |d: f32| if MAD { d.abs() } else { d * d };
    let quant = |iscale: f32, min: f32, v: f32| nearest_int(iscale * (v - min)).clamp(0, nmax);
    let iscale: Lanes = std::array::from_fn(|k| nmaxf / (max[k] - min[k]));
    let mut scale: Lanes = std::array::from_fn(|k| 1.0 / iscale[k]);
    let mut best = [0f32; LANES];
    for i in 0..N {
        for k in 0..LANES {
            let q = quant(iscale[k], min[k], x[i][k]);
            l[i][k] = q as u8;
            best[k] += w[i][k] * err(scale[k] * q as f32 + min[k] - x[i][k]);
        }
    }
    if nstep >= 1 {
        let mut aux = [[0u8; LANES]; N];
        for is in 0..=nstep {
            let step = rmin + rdelta * is as f32 + nmaxf;
            let isc: Lanes = std::array::from_fn(|k| step / (max[k] - min[k]));
            let (mut s_l, mut s_l2, mut s_xl) = ([0f32; LANES], [0f32; LANES], [0f32; LANES]);
            for i in 0..N {
                for k in 0..LANES {
                    let q = if V3 {
                        let v = isc[k] * (x[i][k] - min[k]);
                        if v > 0.0 {
                            nearest_int(v.min(nmaxf))
                        } else {
                            0
                        }
                    } else {
                        quant(isc[k], min[k], x[i][k])
                    };
                    aux[i][k] = q as u8;
                    let qf = q as f32;
                    s_l[k] += w[i][k] * qf;
                    s_l2[k] += w[i][k] * qf * qf;
                    s_xl[k] += w[i][k] * qf * x[i][k];
                }
            }
            let mut this_scale = [0f32; LANES];
            let mut this_min = [0f32; LANES];
            let mut solvable = [false; LANES];
            for k in 0..LANES {
                let det = sum_w[k] * s_l2[k] - s_l[k] * s_l[k];
                solvable[k] = det > 0.0 && !flat[k];
                this_scale[k] = (sum_w[k] * s_xl[k] - sum_x[k] * s_l[k]) / det;
                this_min[k] = (s_l2[k] * sum_x[k] - s_l[k] * s_xl[k]) / det;
                if this_min[k] > 0.0 {
                    this_min[k] = 0.0;
                    this_scale[k] = s_xl[k] / s_l2[k];
                }
            }
            let mut cur = [0f32; LANES];
            for i in 0..N {
                for k in 0..LANES {
                    let d = this_scale[k] * f32::from(aux[i][k]) + this_min[k] - x[i][k];
                    cur[k] += w[i][k] * err(d);
                }
            }
            let take: [bool; LANES] = std::array::from_fn(|k| solvable[k] && cur[k] < best[k]);
            if take.iter().any(|&t| t) {
                for (li, ai) in l.iter_mut().zip(&aux) {
                    for k in 0..LANES {
                        if take[k] {
                            li[k] = ai[k];
                        }
                    }
                }
                for k in 0..LANES {
                    if take[k] {
                        best[k] = cur[k];
                        scale[k] = this_scale[k];
                        min[k] = this_min[k];
                    }
                }
            }
        }
    }
    for k in 0..LANES {
        if flat[k] {
            l.iter_mut().for_each(|li| li[k] = 0);
            min[k] = first_min[k];
            scale[k] = 0.0;
        }
        the_min[k] = -min[k];
    }
    scale
}

/// The 8 sub-blocks of a super-block `x` as lanes: `out[i][k] = x[32k + i]`.
pub(super) fn transpose(x: &[f32]) -> [Lanes; N] {
    std::array::from_fn(|i| std::array::from_fn(|k| x[N * k + i]))
}

#[cfg(test)]
mod tests {
    use super::super::kquants::make_qkx2_quants;
    use super::*;

    /// Every lane gives the one-block search's bits, over random sub-blocks, flat ones,
    /// all-positive ones and each variant (squared or absolute error, qkx2 or qkx3).
    #[test]
    fn lanes_give_the_one_block_bits() {
        let mut seed = 0x9E37_79B9u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            (seed as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        for round in 0..400 {
            let mut x: Vec<f32> = (0..256)
                .map(|_| next() * [0.01, 1.0, 50.0][round % 3])
                .collect();
            if round % 7 == 0 {
                x[32..64].fill(0.25); // a flat sub-block
            }
            if round % 5 == 0 {
                x[64..96].iter_mut().for_each(|v| *v = v.abs() + 0.5); // min > 0
            }
            let w: Vec<f32> = (0..256).map(|i| x[i].abs() + 0.1 * next().abs()).collect();
            let (xt, wt) = (transpose(&x), transpose(&w));
            let check = |got: (Lanes, Lanes, [[u8; LANES]; N]),
                         one: &dyn Fn(usize) -> (f32, f32, [u8; N])| {
                for k in 0..LANES {
                    let (s, m, l) = one(k);
                    assert_eq!(
                        got.0[k].to_bits(),
                        s.to_bits(),
                        "round {round} lane {k}: scale"
                    );
                    assert_eq!(
                        got.1[k].to_bits(),
                        m.to_bits(),
                        "round {round} lane {k}: min"
                    );
                    let lane: [u8; N] = std::array::from_fn(|i| got.2[i][k]);
                    assert_eq!(lane, l, "round {round} lane {k}: quants");
                }
            };
            macro_rules! case {
                ($mad:literal, $v3:literal, $nmax:expr, $search:expr) => {{
                    let (mut l, mut m) = ([[0u8; LANES]; N], [0f32; LANES]);
                    let s = make_qkx_lanes::<$mad, $v3>($nmax, &xt, &wt, &mut l, &mut m, $search);
                    check((s, m, l), &|k| {
                        let xs: &[f32; N] = x[N * k..N * k + N].try_into().unwrap();
                        let ws: &[f32; N] = w[N * k..N * k + N].try_into().unwrap();
                        let (mut l, mut m) = ([0u8; N], 0f32);
                        let s = make_qkx2_quants::<N, $mad, $v3>(
                            $nmax, xs, ws, &mut l, &mut m, $search,
                        );
                        (s, m, l)
                    });
                }};
            }
            case!(false, false, 15, (-1.0, 0.1, 20));
            case!(false, false, 31, (-0.5, 0.1, 15));
            case!(true, false, 3, (-0.5, 0.1, 15));
            case!(false, true, 15, (-0.9, 0.05, 36));
            case!(false, false, 15, (-1.0, 0.1, 0));
        }
    }
}
