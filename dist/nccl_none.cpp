// Builds without NCCL: process groups run on MPI alone, with CPU tensors.
#include "dist/nccl_comm.h"

namespace tg::dist {

bool nccl_built() { return false; }

std::unique_ptr<NcclComm> make_nccl_comm(ProcessGroup::Impl&) {
  throw UnsupportedError("dist: this build has no NCCL; CUDA tensors cannot take part in collectives");
}

}  // namespace tg::dist
