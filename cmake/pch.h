// Precompiled header shared by every Crucible target (see CMakeLists.txt).
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/cloneable.h>
#include <torch/autograd.h>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
