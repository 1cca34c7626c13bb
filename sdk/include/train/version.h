#pragma once

/// The SDK's version. Plugins record it in their descriptor; the worker refuses
/// a plugin whose major version differs from its own.
#define TRAIN_SDK_VERSION_MAJOR 0
#define TRAIN_SDK_VERSION_MINOR 1
#define TRAIN_SDK_VERSION_PATCH 0
#define TRAIN_SDK_VERSION "0.1.0"
