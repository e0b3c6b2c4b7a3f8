// Precompiled header shared by every target: torch/torch.h alone costs ~20 s per file.
#pragma once
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
