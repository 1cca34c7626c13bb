#pragma once

/// The trainrun SDK: everything a plugin's train function uses.
///
///   #include <train/train.h>
///   void train_func(const train::Config& config) { ... train::report({{"loss", l}}); }
///   TRAIN_FUNC(train_func);

#include <train/config.h>
#include <train/context.h>
#include <train/distributed.h>
#include <train/plugin.h>
#include <train/report.h>
#include <train/version.h>
