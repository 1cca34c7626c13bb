#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/nn/pimpl.h>

namespace fashion_mnist {

/// torchvision's BasicBlock: two 3x3 convolutions with a residual connection.
struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in_planes, int64_t planes, int64_t stride);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr}, bn2{nullptr};
  torch::nn::Sequential downsample{nullptr};
};
TORCH_MODULE(BasicBlock);

/// torchvision's ResNet-18, with conv1 a 1-channel 7x7 stride-2 convolution
/// for 28x28 grayscale images.
struct ResNet18Impl : torch::nn::Module {
  explicit ResNet18Impl(int64_t num_classes = 10);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::Conv2d conv1{nullptr};
  torch::nn::BatchNorm2d bn1{nullptr};
  torch::nn::MaxPool2d maxpool{nullptr};
  torch::nn::Sequential layer1{nullptr}, layer2{nullptr}, layer3{nullptr}, layer4{nullptr};
  torch::nn::AdaptiveAvgPool2d avgpool{nullptr};
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(ResNet18);

}  // namespace fashion_mnist
