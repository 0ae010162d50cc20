"""Replay, in plain torch on one GPU, the allocations one rank of DeepSpeed ZeRO-2 makes for a Llama-2-7B
full fine-tune on 2 GPUs (bf16, FusedAdam, contiguous gradients, overlap_comm, the bucket sizes our
export writes), and print torch's peak allocated and reserved. DeepSpeed is not installed here; the
sequence follows deepspeed/runtime/zero/stage_1_and_2.py at edaa722 (profiles/recipes.json, the deepspeed
row's ``zero`` sources): the flat bf16 weights, the fp32 master partition, Adam's two moments, in backward
the autograd gradient of each parameter copied into the IPG buffers and the rank's flat gradient
partition, then the step's flat copy and fp32 cast of the partition. Activations are left out (a
checkpointed micro-batch of 256 tokens holds well under 1 GiB). What it measures is the allocator's
gap on this pattern: reserved less allocated.

    python3 benchmarks/zero2_step_replay.py   # on a GPU with 80 GB; no arguments

Measured on one H100 80GB HBM3 (torch 2.11, the device machine, 2026-11-26): step 0 (Adam's moments
created by the step) 69.03 GiB allocated, 75.63 GiB reserved; steps 1 and 2: 75.31 GiB allocated (2P + 20P/N,
as advisor/estimate/zero_buffers.py counts it), 75.63 GiB reserved, of 79.18 GiB. One slip of the replay:
the backward loop's last view ``v`` keeps the gradient partition alive through the optimizer step (1P more
than DeepSpeed holds there, so step 0 reads 11P = 69.03 GiB); the steady-state peak is the cast, 12P, either way.
"""

# Kept as run on the device (compact: the device command takes 2,000 characters).
# ruff: noqa
import torch
G=2**30;H,M,V,L=4096,11008,32000,32;W=2;B=H*H;d='cuda';b=torch.bfloat16
S=[(V,H)]
for _ in range(L):S+=[(H,H)]*4+[(M,H),(M,H),(H,M),(H,),(H,)]
S+=[(H,),(V,H)]
N=[torch.Size(s).numel() for s in S];T=sum(N);P=-(-T//W);lo,hi=(W-1)*P,T
f=torch.empty(P*W,dtype=b,device=d);ps=[];o=0
for s,n in zip(S,N):ps.append((s,o,n));o+=n
m=f.narrow(0,lo,P).float();m.requires_grad_(True)
opt=torch.optim.AdamW([m],lr=1e-5,fused=True)
for st in range(3):
 ipg=[torch.empty(B,dtype=b,device=d) for _ in range(2)];gp=None;vs=[];i=0;u=0
 for s,a0,n in reversed(ps):
  g=torch.empty(s,dtype=b,device=d)
  if n<=B:
   if u+n>B:i,u=1-i,0
   ipg[i].narrow(0,u,n).copy_(g.view(-1));u+=n
  a,c=max(a0,lo),min(a0+n,hi)
  if a<c:
   if gp is None:gp=torch.empty(hi-lo,dtype=b,device=d)
   v=gp.narrow(0,a-lo,c-a);v.copy_(g.view(-1).narrow(0,a-a0,c-a));vs.append((a,v))
  del g
 del ipg;gp=None;vs=[v for _,v in sorted(vs,key=lambda x:x[0])]
 fg=torch.cat(vs);pad=P-fg.numel()
 if pad:fg=torch.cat([fg,torch.zeros(pad,dtype=b,device=d)])
 sg=fg.to(torch.float32);del fg,vs
 m.grad=sg;opt.step();m.grad=None;del sg
 with torch.no_grad():f.narrow(0,lo,P).copy_(m)
 torch.cuda.synchronize()
 print(st,'alloc %.2f reserved %.2f GiB'%(torch.cuda.max_memory_allocated()/G,torch.cuda.max_memory_reserved()/G),flush=True)
print('T',T,'pred 2T+20T/W %.2f GiB'%((2*T+20*P)/G),torch.cuda.get_device_name(),'%.2f'%(torch.cuda.get_device_properties(0).total_memory/G))
