"""DDP training as pytorch/examples writes it (distributed/ddp-tutorial-series, multigpu_torchrun.py):
a Trainer class, a DistributedSampler over a dataset, a DataLoader, epochs, the loss printed by rank 0.

    torchrun --nproc-per-node 2 ddp_trainer.py [--epochs 2] [--batch-size 8]
"""

import argparse
import os

import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class MyTrainDataset(Dataset):
    def __init__(self, size):
        g = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(64, generator=g), torch.rand(1, generator=g)) for _ in range(size)]

    def __len__(self):
        return len(self.data)

    def __getitem__(self, index):
        return self.data[index]


class Trainer:
    def __init__(self, model, train_data, optimizer):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = torch.device("neuron", self.local_rank)
        self.model = DDP(model.to(self.device), device_ids=[self.local_rank])
        self.train_data = train_data
        self.optimizer = optimizer

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.mse_loss(output, targets)
        loss.backward()
        self.optimizer.step()
        return loss

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            loss = self._run_batch(source.to(self.device), targets.to(self.device))
        if self.local_rank == 0:
            print(f"Epoch {epoch} | Steps: {len(self.train_data)} | loss {loss.item():.4f}")

    def train(self, max_epochs):
        for epoch in range(max_epochs):
            self._run_epoch(epoch)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    args = p.parse_args()
    init_process_group(backend="neuron")
    torch.neuron.set_device(int(os.environ["LOCAL_RANK"]))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    dataset = MyTrainDataset(16)
    loader = DataLoader(dataset, batch_size=args.batch_size, pin_memory=False, shuffle=False,
                        sampler=DistributedSampler(dataset))  # fmt: skip
    Trainer(model, loader, optimizer).train(args.epochs)
    destroy_process_group()


if __name__ == "__main__":
    main()
