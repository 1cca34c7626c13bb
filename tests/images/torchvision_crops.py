#!/usr/bin/env python3
"""torchvision's RandomResizedCrop.get_params, with the random numbers it drew.

Reads cases from stdin, one per line: seed height width scale_low scale_high
ratio_low ratio_high. Prints one JSON line per case: the draws in order
(["u", low, high, value] for a uniform_, ["i", low, high, value] for a
randint) and the crop [top, left, height, width]. Exits 77 without torchvision.
"""
import json
import sys

try:
    import torch
    from torchvision import transforms
except ImportError as error:
    print(f"torchvision is not installed: {error}", file=sys.stderr)
    sys.exit(77)

draws = []
uniform = torch.Tensor.uniform_
randint = torch.randint


def recorded_uniform(self, low=0.0, high=1.0, *args, **kwargs):
    result = uniform(self, low, high, *args, **kwargs)
    draws.append(["u", float(low), float(high), result.item()])
    return result


def recorded_randint(low, high, size, *args, **kwargs):
    result = randint(low, high, size, *args, **kwargs)
    draws.append(["i", int(low), int(high), result.item()])
    return result


torch.Tensor.uniform_ = recorded_uniform
torch.randint = recorded_randint
for line in sys.stdin:
    if not line.strip():
        continue
    seed, height, width, s0, s1, r0, r1 = line.split()
    torch.manual_seed(int(seed))
    draws.clear()
    image = torch.empty(1, int(height), int(width))
    crop = transforms.RandomResizedCrop.get_params(image, (float(s0), float(s1)),
                                                   (float(r0), float(r1)))
    print(json.dumps({"draws": draws, "crop": list(crop)}))
