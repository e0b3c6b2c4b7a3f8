// Process settings that only take effect when read at start-up, so the CLI restarts itself
// once with them in its environment (same arguments):
//
// - Transparent huge pages for the heap. Distributions usually set THP to "madvise", and
//   glibc's malloc asks for huge pages only under GLIBC_TUNABLES=glibc.malloc.hugetlb=1.
//   Without them every fresh activation buffer is faulted in 4 KiB at a time, a VM exit per
//   page on a cloud machine: SD2.1-base 512x512 bf16 on a 2-core EPYC VM, the first VAE decode
//   of a process took 5.5-6.0 s without and 4.0-4.2 s with huge pages, the cold model load
//   8.5-13.5 s against 4.4-5.3 s, peak RSS 3380 against 3012 MiB (README).
// - OpenMP workers that sleep when idle (OMP_WAIT_POLICY=PASSIVE) where OpenBLAS runs its own
//   pthread pool. LibTorch's OpenMP workers spin for a while after every parallel operator;
//   a float32 linear layer right after one (a norm, an activation) then shares the cores
//   with spinning threads: each OpenBLAS call 3-5 ms slower, the float32 UNet step of
//   SD2.1-base 12.1 s -> 10.4-10.8 s on a 2-core EPYC (README). oneDNN (bf16, convolutions)
//   runs on the OpenMP pool itself and is unaffected.
#pragma once

namespace diffuse::app {

// Restarts this program with whichever of the settings above is missing and useful here;
// returns only when it did not restart. Huge pages: unless DIFFUSE_HUGE_PAGES=0, the tunables
// already name hugetlb, THP is "never" or glibc predates the tunable (2.35). Wait policy:
// unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set, or the BLAS is not a pthread OpenBLAS.
void restart_with_startup_settings(char** argv);

}  // namespace diffuse::app
