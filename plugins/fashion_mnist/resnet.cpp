#include "resnet.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>

namespace fashion_mnist {
namespace {

namespace nn = torch::nn;

nn::Conv2d conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding) {
  return nn::Conv2d(nn::Conv2dOptions(in, out, kernel).stride(stride).padding(padding).bias(false));
}

nn::Sequential make_layer(int64_t in_planes, int64_t planes, int64_t stride) {
  nn::Sequential layer;
  layer->push_back(BasicBlock(in_planes, planes, stride));
  layer->push_back(BasicBlock(planes, planes, 1));
  return layer;
}

}  // namespace

BasicBlockImpl::BasicBlockImpl(int64_t in_planes, int64_t planes, int64_t stride) {
  conv1 = register_module("conv1", conv(in_planes, planes, 3, stride, 1));
  bn1 = register_module("bn1", nn::BatchNorm2d(planes));
  conv2 = register_module("conv2", conv(planes, planes, 3, 1, 1));
  bn2 = register_module("bn2", nn::BatchNorm2d(planes));
  if (stride != 1 || in_planes != planes) {
    downsample = register_module("downsample", nn::Sequential(conv(in_planes, planes, 1, stride, 0),
                                                              nn::BatchNorm2d(planes)));
  }
}

torch::Tensor BasicBlockImpl::forward(torch::Tensor x) {
  auto out = torch::relu(bn1(conv1(x)));
  out = bn2(conv2(out));
  out += downsample ? downsample->forward(x) : x;
  return torch::relu(out);
}

ResNet18Impl::ResNet18Impl(int64_t num_classes) {
  conv1 = register_module("conv1", conv(1, 64, 7, 2, 3));
  bn1 = register_module("bn1", nn::BatchNorm2d(64));
  maxpool = register_module("maxpool", nn::MaxPool2d(nn::MaxPool2dOptions(3).stride(2).padding(1)));
  layer1 = register_module("layer1", make_layer(64, 64, 1));
  layer2 = register_module("layer2", make_layer(64, 128, 2));
  layer3 = register_module("layer3", make_layer(128, 256, 2));
  layer4 = register_module("layer4", make_layer(256, 512, 2));
  avgpool = register_module("avgpool", nn::AdaptiveAvgPool2d(nn::AdaptiveAvgPool2dOptions(1)));
  fc = register_module("fc", nn::Linear(512, num_classes));
  // torchvision's initialisation.
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* c = module->as<nn::Conv2d>()) {
      nn::init::kaiming_normal_(c->weight, 0.0, torch::kFanOut, torch::kReLU);
    } else if (auto* b = module->as<nn::BatchNorm2d>()) {
      nn::init::ones_(b->weight);
      nn::init::zeros_(b->bias);
    }
  }
  // The recipe replaces conv1 after torchvision has initialised the model, so
  // it keeps a fresh Conv2d's default initialisation.
  conv1->reset_parameters();
}

torch::Tensor ResNet18Impl::forward(torch::Tensor x) {
  x = maxpool(torch::relu(bn1(conv1(x))));
  x = layer4->forward(layer3->forward(layer2->forward(layer1->forward(x))));
  return fc(torch::flatten(avgpool(x), 1));
}

}  // namespace fashion_mnist
