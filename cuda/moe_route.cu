/* moe_route.cu — placeholder: the routing ops are being written. */
#include "ct_cuda.cuh"

void cuda_fill_moe_route_ops(ct_backend *be) { (void)be; }
