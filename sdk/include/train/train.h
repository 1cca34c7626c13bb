#pragma once

/// The trainrun SDK: everything a plugin's train function uses.
///
///   #include <train/train.h>
///   void train_func(const train::Config& config) {
///     auto model = train::prepare_model(MyNet());
///     auto loader = train::prepare_data_loader(dataset, train::LoaderOptions().batch_size(128));
///     ... train::report({{"loss", l}});
///   }
///   TRAIN_FUNC(train_func);

#include <train/amp.h>
#include <train/callbacks.h>
#include <train/capture.h>
#include <train/checkpoint.h>
#include <train/config.h>
#include <train/context.h>
#include <train/data.h>
#include <train/distributed.h>
#include <train/metric.h>
#include <train/model.h>
#include <train/op_counter.h>
#include <train/optim.h>
#include <train/plugin.h>
#include <train/report.h>
#include <train/shards.h>
#include <train/trainer.h>
#include <train/version.h>
