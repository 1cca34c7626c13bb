#include "resnet50.h"

namespace imagenet {
namespace {

torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride = 1) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, kernel).stride(stride).padding(kernel / 2).bias(false));
}

}  // namespace

BottleneckImpl::BottleneckImpl(int64_t in_planes, int64_t planes, int64_t stride) {
  conv1 = register_module("conv1", conv(in_planes, planes, 1));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(planes));
  conv2 = register_module("conv2", conv(planes, planes, 3, stride));  // the stride here (v1.5)
  bn2 = register_module("bn2", torch::nn::BatchNorm2d(planes));
  conv3 = register_module("conv3", conv(planes, planes * kExpansion, 1));
  bn3 = register_module("bn3", torch::nn::BatchNorm2d(planes * kExpansion));
  if (stride != 1 || in_planes != planes * kExpansion) {
    downsample = register_module(
        "downsample", torch::nn::Sequential(conv(in_planes, planes * kExpansion, 1, stride),
                                            torch::nn::BatchNorm2d(planes * kExpansion)));
  }
}

torch::Tensor BottleneckImpl::forward(torch::Tensor x) {
  auto out = torch::relu(bn1(conv1(x)));
  out = torch::relu(bn2(conv2(out)));
  out = bn3(conv3(out));
  return torch::relu(out + (downsample ? downsample->forward(x) : x));
}

ResNet50Impl::ResNet50Impl(int64_t num_classes) {
  conv1 = register_module("conv1", conv(3, 64, 7, 2));
  bn1 = register_module("bn1", torch::nn::BatchNorm2d(64));
  int64_t in_planes = 64;
  const auto layer = [&](int64_t planes, int blocks, int64_t stride) {
    torch::nn::Sequential sequence;
    for (int b = 0; b < blocks; ++b) {
      sequence->push_back(Bottleneck(in_planes, planes, b == 0 ? stride : 1));
      in_planes = planes * BottleneckImpl::kExpansion;
    }
    return sequence;
  };
  layer1 = register_module("layer1", layer(64, 3, 1));
  layer2 = register_module("layer2", layer(128, 4, 2));
  layer3 = register_module("layer3", layer(256, 6, 2));
  layer4 = register_module("layer4", layer(512, 3, 2));
  fc = register_module("fc", torch::nn::Linear(512 * BottleneckImpl::kExpansion, num_classes));
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* c = module->as<torch::nn::Conv2d>()) {
      torch::nn::init::kaiming_normal_(c->weight, 0, torch::kFanOut, torch::kReLU);
    } else if (auto* bn = module->as<torch::nn::BatchNorm2d>()) {
      torch::nn::init::ones_(bn->weight);
      torch::nn::init::zeros_(bn->bias);
    }
  }
}

torch::Tensor ResNet50Impl::forward(torch::Tensor x) {
  x = torch::relu(bn1(conv1(x)));
  x = torch::max_pool2d(x, 3, 2, 1);
  x = layer1->forward(x);
  x = layer2->forward(x);
  x = layer3->forward(x);
  x = layer4->forward(x);
  x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
  return fc(x);
}

}  // namespace imagenet
