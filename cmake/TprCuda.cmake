# TPR_CUDA=AUTO builds the CUDA backend when nvcc is found (the toolkit lives
# under /usr/local/cuda on our machines); ON requires it; OFF skips it.
set(TPR_HAVE_CUDA OFF)
if(NOT TPR_CUDA STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(TPR_HAVE_CUDA ON)
  elseif(TPR_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TPR_CUDA=ON but no CUDA compiler was found (looked for nvcc on PATH and /usr/local/cuda/bin/nvcc)")
  else()
    message(STATUS "tpr: nvcc not found, building without the CUDA backend")
  endif()
endif()

if(TPR_HAVE_CUDA)
  set(CMAKE_CUDA_ARCHITECTURES 80 90)
  set(CMAKE_CUDA_STANDARD 17)
  # The *.cu files join libtpr itself (see CMakeLists.txt): they call back
  # into the runtime, so a separate static library would need link cycles.
  file(GLOB TPR_CUDA_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/runtime/*.cu ${CMAKE_SOURCE_DIR}/runtime/ops/*.cu)
  message(STATUS "tpr: CUDA backend ON (${CMAKE_CUDA_COMPILER}, sm_80 and sm_90)")
endif()
